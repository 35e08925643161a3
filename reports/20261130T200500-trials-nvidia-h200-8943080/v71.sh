# v71's kernel GPU tests, both sanitizers and its A/B on a GPU machine, from the repository root:
#   bash v71.sh OUTDIR SHA
out=${1:?usage}; sha=${2:?usage}
work=$(mktemp -d)
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$work/site" .whl/*.whl || exit 1
export PYTHONPATH="$work/site" PYTHONUNBUFFERED=1
export GIT_DIR="$work/no-git" VERIFY_ATTN_GIT_SHA=$sha VERIFY_ATTN_GIT_DIRTY=0
nvidia-smi > "$out/nvidia-smi.txt" 2>&1
timeout 150 python3 -m pytest -m gpu -q -p no:cacheprovider -rs -n 8 tests/test_kernel_gpu.py tests/test_split_boundaries.py tests/test_every_mask_bit.py > "$out/kernel-gpu-tests.log" 2>&1
echo "rc=$? $SECONDS s" >> "$out/kernel-gpu-tests.log"
timeout 110 python3 -m pytest -m gpu -q -p no:cacheprovider -rs tests/test_kernel_sanitizer.py > "$out/sanitizer.log" 2>&1
echo "rc=$? $SECONDS s" >> "$out/sanitizer.log"
timeout 240 python3 -m harness ab --base-define VA_SLOTS_AFTER_WAIT --grid reports/_work/v71/v71.toml --out "$out/ab" > "$out/ab.log" 2>&1
echo "rc=$? $SECONDS s" >> "$out/ab.log"
tar czf "$out/ab.tar.gz" -C "$out" ab && rm -rf "$out/ab"
copy=$(mktemp -d); here=$(pwd)
cp -r kernel harness pyproject.toml "$copy"/ 2>/dev/null
(cd "$copy" && python3 "$here/reports/_work/tl69/tl69_patch.py" && for pass in 1 2; do
  CASES="32768,16,16,wgmma-ws-pipe" python3 "$here/reports/_work/tl69/tl69_run.py" >> "$out/tl71.jsonl" 2>> "$out/tl71.err"; done) > "$out/tl71.log" 2>&1
echo "rc=$? $SECONDS s" >> "$out/tl71.log"
cd "$out" && tar czf ../v71-out.tar.gz . && cd .. && rm -rf "$out" && mkdir -p "$out" && mv v71-out.tar.gz "$out"/
