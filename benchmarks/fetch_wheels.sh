#!/usr/bin/env bash
# Downloads (here, where PyPI is reachable) the wheels of the packages txf
# imports that the lent GPU machines' image lacks, into .whl/ (git-ignored),
# for benchmarks/gpu.sh to install there. The image has jax (CUDA), flax,
# optax, orbax, numpy, torch, transformers, sentencepiece, protobuf, absl,
# PyYAML; it lacks ml_collections and tensorboardX (tensorflow-datasets and
# grain are imported only for tfds: datasets, which the benchmarks do not read).
set -euo pipefail
cd "$(dirname "$0")/.."
rm -rf .whl
python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 \
  --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
  --platform manylinux2014_x86_64 -d .whl ml_collections==1.1.0 tensorboardX==2.6.5
ls -l .whl
