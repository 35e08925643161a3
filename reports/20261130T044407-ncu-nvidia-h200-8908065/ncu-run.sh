export PYTHONUNBUFFERED=1 MAX_JOBS=16
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl >/dev/null 2>&1 && export PYTHONPATH=/tmp/site
mkdir -p $OUT/ncu
t=$SECONDS; python3 .scratch/t/prebuild.py 2>&1 | tail -1; echo build $((SECONDS-t)) s
NCU=$(which ncu || ls /usr/local/cuda*/bin/ncu 2>/dev/null | head -1); echo ncu: $NCU
for c in "131072 64 16" "65536 8 16"; do
  n=$(echo $c | tr ' ' '-')
  timeout 150 $NCU -k regex:wgmma_ws --launch-skip 1 -c 1 --section WarpStateStats --section SourceCounters --section InstructionStats --section SpeedOfLight -o /tmp/ws-$n python3 .scratch/t/ncu_cfg.py $c 0 > $OUT/ncu/run-$n.log 2>&1; tail -1 $OUT/ncu/run-$n.log
  timeout 60 $NCU -i /tmp/ws-$n.ncu-rep --page source --csv --print-source sass 2>&1 | gzip > $OUT/ncu/ws-$n-source.csv.gz
  timeout 60 $NCU -i /tmp/ws-$n.ncu-rep --page details 2>&1 > $OUT/ncu/ws-$n-details.txt
  echo $n at $SECONDS s
done
ls -la $OUT/ncu
