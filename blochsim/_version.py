# The one version source: pyproject.toml reads it (scikit-build-core regex provider),
# CMake receives it as SKBUILD_PROJECT_VERSION, and the CUDA packages pin it.
__version__ = "0.1.0"
