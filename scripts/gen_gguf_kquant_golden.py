# Generates the block-format golden values in tests/formats/gguf_test.cc: deterministic Q4_K /
# Q6_K / Q5_K / Q2_K / Q3_K blocks, and Q5_0 / Q5_1 blocks (8 with the first scales, 8 with the second),
# dequantized by gguf-py (pip install gguf numpy), printed as sampled values.
import numpy as np, struct
from gguf.quants import dequantize
from gguf import GGMLQuantizationType as Q

def blk(nbytes, seed):
    return bytearray(((i * 37 + seed * 11 + (i >> 3) * 5) & 0xff) for i in range(nbytes))

def f16bits(x):
    return np.array([x], dtype=np.float16).view(np.uint16)[0]

# Q4_K: two blocks; d/dmin at bytes 0..3
q4 = bytearray()
for b, (d, dm) in enumerate([(0.0125, 0.003), (-0.5, 0.25)]):
    x = blk(144, b + 1)
    struct.pack_into('<HH', x, 0, f16bits(d), f16bits(dm))
    q4 += x
y4 = dequantize(np.frombuffer(bytes(q4), dtype=np.uint8), Q.Q4_K).astype(np.float64).ravel()
q6 = bytearray()
for b, d in enumerate([0.02, -0.0078125]):
    x = blk(210, b + 3)
    struct.pack_into('<H', x, 208, f16bits(d))
    q6 += x
y6 = dequantize(np.frombuffer(bytes(q6), dtype=np.uint8), Q.Q6_K).astype(np.float64).ravel()
q5k = bytearray()
for b, (d, dm) in enumerate([(0.0125, 0.003), (-0.5, 0.25)]):
    x = blk(176, b + 5)
    struct.pack_into('<HH', x, 0, f16bits(d), f16bits(dm))
    q5k += x
y5k = dequantize(np.frombuffer(bytes(q5k), dtype=np.uint8), Q.Q5_K).astype(np.float64).ravel()
def q5_32(nbytes, seed, has_min, qtype):
    out = bytearray()
    for b in range(16):
        x = blk(nbytes, seed + b)
        d, m = (0.0625, -1.5) if b < 8 else (-0.013, 0.25)
        struct.pack_into('<H', x, 0, f16bits(d))
        if has_min:
            struct.pack_into('<H', x, 2, f16bits(m))
        out += x
    return dequantize(np.frombuffer(bytes(out), dtype=np.uint8), qtype).astype(np.float64).ravel()
y50 = q5_32(22, 7, False, Q.Q5_0)
y51 = q5_32(24, 9, True, Q.Q5_1)
q2k = bytearray()
for b, (d, dm) in enumerate([(0.0125, 0.003), (-0.5, 0.25)]):
    x = blk(84, b + 11)
    struct.pack_into('<HH', x, 80, f16bits(d), f16bits(dm))
    q2k += x
y2k = dequantize(np.frombuffer(bytes(q2k), dtype=np.uint8), Q.Q2_K).astype(np.float64).ravel()
q3k = bytearray()
for b, d in enumerate([0.02, -0.0078125]):
    x = blk(110, b + 13)
    struct.pack_into('<H', x, 108, f16bits(d))
    q3k += x
y3k = dequantize(np.frombuffer(bytes(q3k), dtype=np.uint8), Q.Q3_K).astype(np.float64).ravel()
idx = [0, 1, 17, 31, 32, 63, 64, 100, 127, 128, 150, 191, 200, 255, 256, 300, 383, 400, 511]
for name, y in (("q4k", y4), ("q6k", y6), ("q5k", y5k), ("q5_0", y50), ("q5_1", y51),
                ("q2k", y2k), ("q3k", y3k)):
    print(name, len(y), repr(float(y.sum())), repr(float(np.abs(y).sum())))
    print(", ".join("{%d, %.9g}" % (i, y[i]) for i in idx))
