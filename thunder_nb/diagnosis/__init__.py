"""The diagnosis: what the runtime writes down (`plans`), what it reads from the transform and runner (`protocols`),
the rules and reasons it judges with (`rules`), the report's records (`model`), what each op is (`ops`), thunder's
generated source read back (`source`), the rules' checks (`checker`), the report of a jitted function (`analysis`),
failures in words (`failures`), and the one judge of "equal" every verdict asks (`judge`)."""
