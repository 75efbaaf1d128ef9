/* GGML's MXFP4 (type 39, OCP microscaling FP4, gpt-oss's expert weights): blocks of 32 values in 17 bytes,
one e8m0 exponent byte e then 16 bytes of 4-bit e2m1 codes (value j in the low nibble of byte j, value
j + 16 in the high one: IQ4_NL's order). Value = e2m1(code) * 2^(e - 127).

The e2m1 values are halves (0, 0.5, 1, 1.5, 2, 3, 4, 6): stored doubled as int8 (0 .. 12), with the scale
halved to 2^(e - 128) (a float32 for every e, subnormal for e < 2), so each weight is int8 * float, as in
ggml and gguf.quants, and dequantizing rounds nothing. The i-quant kernels (lc_iquants.h) run it: one
32-value sub-block per block, decoded through the 16-entry table like IQ4_NL's. */
#ifndef LC_MXFP4_H
#define LC_MXFP4_H

static const int8_t lc_mxfp4_values[16] = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12};

/* 2^(e - 128) from its bits: exponent field e - 1, or the subnormal 2^(e - 128) = 2^21 << e ulps. */
static inline float lc_e8m0_half(uint8_t e) {
    uint32_t bits = e < 2 ? (uint32_t)0x00200000u << e : (uint32_t)(e - 1) << 23;
    float f;
    memcpy(&f, &bits, 4);
    return f;
}
#endif /* LC_MXFP4_H */
