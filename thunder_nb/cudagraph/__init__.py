"""The CUDA-graph runtime behind `thunder_nb.fix`: the transform's passes, the scalar hand-off, the runner and the
memory its graph instances write. Nothing here draws or words anything: `thunder_nb.diagnosis` reads what it did."""
