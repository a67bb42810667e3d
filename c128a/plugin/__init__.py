"""The pytest plugin (:mod:`.pytest_plugin`, registered through the
``pytest11`` entry point): the suite's options, device choice, Hypothesis
profiles, markers and GPU pinning of xdist workers."""
