# The profiles in this folder: bash ncu-run.sh OUTDIR, from the repository root on a GPU machine
# with Nsight Compute (ncu) on the PATH; the first call builds the extension.
set -eu
out=${1:?usage: bash ncu-run.sh OUTDIR}
here=$(dirname "$0")
mkdir -p "$out"
for c in "131072 64 16" "65536 8 16"; do
  n=$(echo $c | tr ' ' '-')
  ncu -k regex:wgmma_ws --launch-skip 1 -c 1 --section WarpStateStats --section SourceCounters \
    --section InstructionStats --section SpeedOfLight -o "$out/ws-$n" \
    python3 "$here/ncu_cfg.py" $c 0 > "$out/run-$n.log" 2>&1
  ncu -i "$out/ws-$n.ncu-rep" --page source --csv --print-source sass | gzip > "$out/ws-$n-source.csv.gz"
  ncu -i "$out/ws-$n.ncu-rep" --page details > "$out/ws-$n-details.txt"
done
