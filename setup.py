"""Packaging for adaptdl-ray: the elastic training library (adaptdl_core) and its Ray layer."""

from pathlib import Path

from setuptools import find_packages, setup

HERE = Path(__file__).parent

# torch is a range, not a pin: an already-installed torch >= 2.2 (for example the CPU
# wheel from `pip install torch==2.13.0`) satisfies it and nothing more is downloaded.
CORE_REQUIRES = ["torch>=2.2", "numpy>=2.0", "scipy>=1.11"]
TUNE_REQUIRES = ["ray[tune]>=2.60,<3", "hyperopt>=0.2.7"]
EXAMPLES_REQUIRES = ["scikit-learn>=1.3"]
# The command line and the cluster allocator use Ray's Job Submission API and dashboard.
CLUSTER_REQUIRES = ["ray[default]>=2.60,<3"]
# The documentation site (docs/README.md); its API reference imports the Ray layer.
DOCS_REQUIRES = ["sphinx>=7.2", "myst-parser>=3"]
TEST_REQUIRES = ["pytest>=7", "pytest-xdist>=3"] + TUNE_REQUIRES + EXAMPLES_REQUIRES + CLUSTER_REQUIRES + DOCS_REQUIRES

setup(
    name="adaptdl-ray",
    version="0.1.0",
    description=(
        "Resource-adaptive deep learning on Ray: elastic checkpoint-restart training, "
        "goodput-based batch sizes and a Pollux scheduler for Ray Tune."
    ),
    long_description=(HERE / "README.md").read_text(encoding="utf-8"),
    long_description_content_type="text/markdown",
    license="Apache-2.0",
    python_requires=">=3.10",
    packages=find_packages(include=["adaptdl_core", "adaptdl_core.*", "adaptdl_ray", "adaptdl_ray.*"]),
    # The simulator's vendored traces, workloads and published results (adaptdl_core/sim/data).
    package_data={"adaptdl_core.sim": ["data/README.md", "data/traces/*/*.csv",
                                       "data/workloads/*/*.csv", "data/published/*.json"]},
    install_requires=CORE_REQUIRES,
    entry_points={"console_scripts": ["adaptdl-ray = adaptdl_ray.cli:main"]},
    extras_require={
        "tune": TUNE_REQUIRES,
        "examples": EXAMPLES_REQUIRES + TUNE_REQUIRES,
        "cluster": CLUSTER_REQUIRES + TUNE_REQUIRES,
        "docs": DOCS_REQUIRES + TUNE_REQUIRES + CLUSTER_REQUIRES,
        "test": TEST_REQUIRES,
        "plot": ["matplotlib>=3.7"],
    },
    classifiers=[
        "Programming Language :: Python :: 3",
        "License :: OSI Approved :: Apache Software License",
        "Topic :: Scientific/Engineering :: Artificial Intelligence",
    ],
)
