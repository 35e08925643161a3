# v72's pair merge against v69's store (VA_NO_PAIR_MERGE), a timeline of P=32k H=8 T=16 (wgmma-ws)
# and H=16 T=16 (wgmma-ws-pipe), on a GPU machine, from the repository root:
#   bash reports/_work/tl72/tl72.sh OUTDIR SHA
out=${1:?usage}; sha=${2:?usage}
work=$(mktemp -d)
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$work/site" .whl/*.whl || exit 1
export PYTHONPATH="$work/site" PYTHONUNBUFFERED=1
export GIT_DIR="$work/no-git" VERIFY_ATTN_GIT_SHA=$sha VERIFY_ATTN_GIT_DIRTY=0
here=$(pwd)
export CASES="32768,8,16,wgmma-ws;32768,16,16,wgmma-ws-pipe" ROUNDS=9
for v in v72 v69; do
  copy=$(mktemp -d)
  cp -r kernel harness pyproject.toml "$copy"/ 2>/dev/null
  (cd "$copy" && python3 "$here/reports/_work/tl67/tl67_patch.py" && python3 "$here/reports/_work/tlws/tlws_extra.py" \
    && python3 "$here/reports/_work/tl72/tl72_extra.py" || exit 1
   if [ $v = v69 ]; then export VERIFY_ATTN_EXTRA_CUDA_FLAGS=-DVA_NO_PAIR_MERGE; fi
   export VERIFY_ATTN_BUILD_DIR="$work/build-$v"
   for pass in 1 2; do python3 "$here/reports/_work/tl72/tl72_run.py" | sed "s/^{/{\"build\": \"$v\", /" >> "$out/tl72.jsonl" 2>> "$out/tl72.err"; done)
  echo "$v done $SECONDS s" >> "$out/tl72.log"
done
