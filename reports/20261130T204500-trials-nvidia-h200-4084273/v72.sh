# v72's kernel GPU tests, both sanitizers, its launch plans and its A/B on a GPU machine, from the
# repository root:
#   bash reports/_work/v72/v72.sh OUTDIR SHA
out=${1:?usage}; sha=${2:?usage}
work=$(mktemp -d)
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$work/site" .whl/*.whl || exit 1
export PYTHONPATH="$work/site" PYTHONUNBUFFERED=1
export GIT_DIR="$work/no-git" VERIFY_ATTN_GIT_SHA=$sha VERIFY_ATTN_GIT_DIRTY=0
nvidia-smi > "$out/nvidia-smi.txt" 2>&1
python3 - > "$out/launch-plans.jsonl" 2> "$out/launch-plans.err" <<'PY'
import json, torch, kernel
ext = kernel.load_extension()
for b, t, h, k in [(1, 16, 8, 32784), (1, 16, 16, 32784), (1, 64, 64, 32832), (1, 16, 64, 200016), (4, 64, 16, 4 * 65552)]:
    for c in ("wgmma-ws", "wgmma-ws-pipe"):
        d = dict(ext.launch_plan(0, b, t, h, k, kernel._config_id(c)))
        print(json.dumps({"batch": b, "tokens": t, "heads": h, "keys": k, "config_asked": c, **d}))
print(json.dumps({"sms": torch.cuda.get_device_properties(0).multi_processor_count}))
PY
timeout 170 python3 -m pytest -m gpu -q -p no:cacheprovider -rs -n 8 tests/test_kernel_gpu.py tests/test_split_boundaries.py tests/test_every_mask_bit.py > "$out/kernel-gpu-tests.log" 2>&1
echo "rc=$? $SECONDS s" >> "$out/kernel-gpu-tests.log"
timeout 120 python3 -m pytest -m gpu -q -p no:cacheprovider -rs tests/test_kernel_sanitizer.py > "$out/sanitizer.log" 2>&1
echo "rc=$? $SECONDS s" >> "$out/sanitizer.log"
timeout 270 python3 -m harness ab --base-define VA_NO_PAIR_MERGE --grid reports/_work/v72/v72.toml --out "$out/ab" > "$out/ab.log" 2>&1
echo "rc=$? $SECONDS s" >> "$out/ab.log"
tar czf "$out/ab.tar.gz" -C "$out" ab && rm -rf "$out/ab"
cd "$out" && tar czf ../v72-out.tar.gz . && cd .. && rm -rf "$out" && mkdir -p "$out" && mv v72-out.tar.gz "$out"/
