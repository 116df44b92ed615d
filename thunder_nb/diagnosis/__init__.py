"""The diagnosis: what the runtime writes down (`plans`), the report's records (`model`), what each op is (`ops`),
thunder's generated source read back (`source`), the rules (`checker`), the report of a jitted function (`analysis`)
and failures in words (`failures`)."""
