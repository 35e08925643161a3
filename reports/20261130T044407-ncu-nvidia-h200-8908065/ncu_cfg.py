import math, os, random, sys
import torch
sys.path.insert(0, os.getcwd()); sys.path.insert(0, os.path.join(os.getcwd(), ".scratch"))
import kernel
from first_lib import make
mod = kernel.load_extension()
P, H, T, C = (int(x) for x in sys.argv[1:5])
d = make(random.Random(0), [P], [T], H)
m, mi = kernel.pack_parents(d["parents"]); m = m.cuda(); mi = mi.cuda()
for _ in range(2):
    mod.verify_attention(d["q"], d["kv"], d["idx"], d["qo"], d["kvp"], m, mi, 1 / math.sqrt(192), None, None, False, C, 0)
torch.cuda.synchronize()
