# The suite's options, Hypothesis profiles, device selection and markers live
# in the c128a pytest plugin (c128a/pytest_plugin.py), which an installed
# package registers through its entry point. Naming it here also loads it from
# a source checkout that was never installed (the same name, so never twice).
pytest_plugins = ["pytester", "c128a.pytest_plugin"]
