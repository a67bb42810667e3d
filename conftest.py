# The suite's options, Hypothesis profiles, device selection and markers live
# in the c128a pytest plugin (c128a/plugin/pytest_plugin.py), which an
# installed package registers through its entry point. Naming it here too
# loads it from a checkout that was never installed (this folder is on
# sys.path through this conftest); the entry point and this name are the
# same, so it is registered once.
pytest_plugins = ["pytester", "c128a.plugin.pytest_plugin"]
