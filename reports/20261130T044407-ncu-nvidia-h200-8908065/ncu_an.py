import csv, gzip, sys, collections
rows = list(csv.reader(gzip.open(sys.argv[1], 'rt')))
hdr = rows[1]; data = rows[2:]
ci = {h: i for i, h in enumerate(hdr)}
stall_cols = [h for h in hdr if h.startswith('stall_') and 'Not Issued' not in h]
ins = []
for r in data:
    if len(r) < len(hdr): continue
    addr = int(r[0], 16); src = r[1].strip()
    samp = int(r[ci["Warp Stall Sampling (All Samples)"]] or 0)
    ex = int(r[ci["Instructions Executed"]] or 0)
    st = {h: int(r[ci[h]] or 0) for h in stall_cols}
    ins.append((addr, src, samp, ex, st))
base = ins[0][0]
tot = sum(i[2] for i in ins)
print("total samples", tot)
# Aggregate by region: find PV loop and WG0 loop by address ranges given as offsets
regions = [tuple(int(x, 16) for x in a.split('-')) for a in sys.argv[2:]]
for lo, hi in regions:
    sel = [i for i in ins if lo <= i[0] - base <= hi]
    s = sum(i[2] for i in sel)
    agg = collections.Counter()
    for i in sel:
        for k, v in i[4].items(): agg[k] += v
    print(f"region {lo:#x}-{hi:#x}: {len(sel)} instr, {s} samples ({100*s/tot:.1f} %), stalls: {[(k[6:], v) for k, v in agg.most_common(8)]}")
    top = sorted(sel, key=lambda i: -i[2])[:25]
    for i in top:
        st = sorted(i[4].items(), key=lambda kv: -kv[1])[:3]
        print(f"   {i[0]-base:#07x} {i[2]:6d} ex {i[3]:8d}  {i[1][:70]:70s} {[(k[6:], v) for k, v in st if v]}")
