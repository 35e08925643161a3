"""On top of tl67_patch.py and tlws_extra.py: stamps in v72's pair merge (pair_merge_epilogue), by
thread 0 of each PV warpgroup (tid 128: WG1, half 0; tid 256: WG2, half 1), and WG2's end. Apply
from the copy's root after the other two: python3 tl72_extra.py"""
from pathlib import Path

p = Path("kernel/csrc/verify_attention_sm90.cuh")
s = p.read_text()
pairs = [
    ("""  cluster_sync_all();  // both CTAs' PV done: every KV stage free
""", """  cluster_sync_all();  // both CTAs' PV done: every KV stage free
  TL_AT(0, 24, threadIdx.x == 128);
  TL_AT(0, 25, threadIdx.x == 256);
"""),
    ("""    cluster_sync_all();  // the peer's keeper reads what this warpgroup wrote
""", """    TL_AT(0, 26, threadIdx.x == 128 || threadIdx.x == 256);
    cluster_sync_all();  // the peer's keeper reads what this warpgroup wrote
"""),
    ("""  cluster_sync_all();  // the peer's sender has written this CTA's stage 0
""", """  cluster_sync_all();  // the peer's sender has written this CTA's stage 0
  TL_AT(0, 27, threadIdx.x == 128 || threadIdx.x == 256);
"""),
    ("""  // o is now normalised (row sums of 1).
""", """  TL_AT(0, 28, threadIdx.x == 128 || threadIdx.x == 256);
  // o is now normalised (row sums of 1).
"""),
    ("""      store_rows<kM>(p, w, o, m_lo, m_hi, l_lo, l_hi, r_lo, half * 256 + (lane % 4) * 2, half == 0);
    TL_AT(0, 23, tid == 128);
""", """      store_rows<kM>(p, w, o, m_lo, m_hi, l_lo, l_hi, r_lo, half * 256 + (lane % 4) * 2, half == 0);
    TL_AT(0, 23, tid == 128);
    TL_AT(0, 29, tid == 256);
"""),
]
for a, b in pairs:
    if s.count(a) != 1:
        assert "pair_merge" not in a and "cluster_sync" not in a and "normalised (row" not in a, a[:60]
        continue
    s = s.replace(a, b)
p.write_text(s)
print("patched v72 stamps")
