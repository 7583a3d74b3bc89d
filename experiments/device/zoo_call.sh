#!/usr/bin/env bash
# One device call of the detached zoo build (docs/zoo.md, "Running the build on the lent H200"):
# start the build if it is not running, wait up to LIMIT seconds, send back every finished model
# (a tar in 15 MiB parts under $OUT) and the logs. Run it again at once to keep the machine warm.
#   device run: LIMIT=540 bash experiments/device/zoo_call.sh
#   carry: runs/corpus.tar.xz and .whl (the wheels). The tarball holds the token arrays only (the
#   tokenizer is the shipped target's), to stay inside the 64 MiB a call carries:
#   tar -cf - -C runs corpus/train.npy corpus/heldout.npy corpus/stats.json | xz -9e > runs/corpus.tar.xz
# MODELS (build_zoo --models) retrains some models only; a target (target, hybrid) not among them
# is the shipped one (specdec/zoo/NAME, copied, not sent back): its drafters train against it.
#   MODELS=hybrid,hybrid_mtp: the hybrid target and its MTP head (issue 25).
set -u
T0=$(date +%s); LIMIT=${LIMIT:-540}; JOBS=${JOBS:-7}
MODELS=${MODELS:-target,draft_lm,mtp,eagle3,block8,block16,dflash2,dspark}
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site || exit
mkdir -p runs/log
[ -d runs/corpus ] || tar -xJf runs/corpus.tar.xz -C runs
[ -f runs/corpus/tokenizer.json ] || cp specdec/zoo/target/tokenizer.json runs/corpus/
if [ ! -f runs/log/start ]; then
  nvidia-smi --query-gpu=name,memory.total --format=csv
  date +%s > runs/log/start
  for t in target hybrid; do
    case ",$MODELS," in *,$t,*) ;; *) [ -d specdec/zoo/$t ] && mkdir -p runs/newzoo \
      && cp -r specdec/zoo/$t runs/newzoo/ ;; esac
  done
  # The trainers' full-sequence forwards take cuDNN's fused attention only where its GPU tests
  # pass here (tests/ops/test_attention_from_zero.py); else the build runs on attend_xla.
  JAX_PLATFORMS=cuda python3 -m pytest -q -p no:cacheprovider -m gpu -o addopts= \
    tests/ops/test_attention_from_zero.py > runs/log/gpu_tests.log 2>&1 \
    || export SPECDEC_ATTENTION=xla
  tail -3 runs/log/gpu_tests.log; echo "SPECDEC_ATTENTION=${SPECDEC_ATTENTION:-auto}"
  XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1 setsid nohup bash -c \
    "python3 -m experiments.build_zoo --corpus_dir=runs/corpus --out=runs/newzoo --jobs=$JOBS \
     --models=$MODELS \
     > runs/log/build.log 2>&1; date +%s > runs/log/DONE" > /dev/null 2>&1 < /dev/null &
  sleep 2
fi
while [ $(( $(date +%s) - T0 )) -lt "$LIMIT" ] && [ ! -f runs/log/DONE ]; do sleep 5; done
nvidia-smi --query-gpu=utilization.gpu,memory.used --format=csv
done_dirs=$(cd runs && for d in newzoo/*; do
  [ -f "$d/training.json" ] && [[ ",$MODELS," == *",${d#newzoo/},"* ]] && echo "$d"; done)
echo "finished:" $done_dirs
[ -n "$done_dirs" ] && tar -cf - -C runs $done_dirs | split -b 15M - "$OUT/zoo.tar."
tar -czf "$OUT/logs.tgz" runs/log /tmp/zoo_ckpt/*.log 2>/dev/null
for f in runs/log/build.log /tmp/zoo_ckpt/*.log; do
  [ -f "$f" ] && { echo "== $f"; tr '\r' '\n' < "$f" | grep -v '^\s*$' | tail -2 | cut -c1-200; }
done
