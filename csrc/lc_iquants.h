/* The GGUF i-quants (IQ4_NL, IQ4_XS, IQ3_XXS, IQ3_S, IQ2_XXS, IQ2_XS, IQ2_S, IQ1_S, IQ1_M), the ternary
TQ1_0/TQ2_0 and MXFP4 (lc_mxfp4.h): matmul straight from their blocks (nothing dequantized to a dense copy).

Every one of them is, per 32 weights, signed integer values times a float scale that changes at most
every 4 values, so one decoded form serves them all: v[32] int8 and ls[8] (one per 4-value lane), weight
j = ls[j / 4] * v[j]. The codebook types look their values up in the grids (lc_iq_grids.h, generated from
the gguf package's data) and flip signs from 7-bit sign indices; IQ1_S/IQ1_M's +-1/8 shift becomes
v = 8 * grid +- 1 with ls = scale / 8 (exact: a power of two), so dequantizing with `ls * v` rounds once,
as `gguf.quants.dequantize` does, and reproduces it bit for bit. Dot products take the activations of
lc_quantize (8 bits per value, one scale per 32) with exact integer sums per lane.

Included once per ISA (LC_FN names its functions): portable C decodes a row and runs plain loops; AVX2 and
AVX-512 VNNI decode every type in registers: IQ4_NL/IQ4_XS/MXFP4 through vpshufb of the 16-entry table, the
IQ2/IQ3 grids as unsigned magnitudes times the activations with the weights' signs applied (AVX-512: one
masked subtract), IQ1 as sign(8, grid) + shift, the ternary digits by shifts and 16-bit multiplies. The
256-value block types run a block at a time with the type a literal (iq_brow; IQ3 on AVX-512: 64 values per
512-bit step, iq3_brow). Steps of many rows run lc_iq_gemm.h instead, which decodes through iq_sub. */

#ifndef LC_IQ_COMMON
#define LC_IQ_COMMON
#include "lc_iq_grids.h"

static inline int lc_is_iq(int type) {
    return (type >= LC_IQ2_XXS && type <= LC_IQ4_XS) || type == LC_IQ1_M || type == LC_TQ1_0 || type == LC_TQ2_0 ||
           type == LC_MXFP4 || lc_is_lowbit(type);
}

static inline uint32_t lc_u32(const uint8_t *p) {
    return (uint32_t)p[0] | ((uint32_t)p[1] << 8) | ((uint32_t)p[2] << 16) | ((uint32_t)p[3] << 24);
}

/* v[8] = grid row g with sign bit j of `signs` negating value j: branch-free ((g ^ m) - m, m = 0 or -1),
   as random signs made a branch per value mispredict half the time (~4x slower decode). */
static inline void lc_iq_signed8(const int8_t *g, uint8_t signs, int8_t *v) {
    for (int j = 0; j < 8; j++) {
        int m = -((signs >> j) & 1);
        v[j] = (int8_t)((g[j] ^ m) - m);
    }
}

static inline uint32_t lc_iq_ksigns4(uint32_t aux) { /* four 7-bit sign indices -> four sign bytes */
    return (uint32_t)lc_iq_ksigns[aux & 127] | ((uint32_t)lc_iq_ksigns[(aux >> 7) & 127] << 8) |
           ((uint32_t)lc_iq_ksigns[(aux >> 14) & 127] << 16) | ((uint32_t)lc_iq_ksigns[(aux >> 21) & 127] << 24);
}

/* Sub-block s (values 32 s .. 32 s + 31) of block b: v[32], ls[8] (see the top of this file). The scale
   expressions keep the reference dequantizer's float32 operation order, so they round alike. */
static void lc_iq_dec(int type, const uint8_t *b, int s, int8_t *v, float *ls) {
    float sc[2]; /* the scale of each 16 values; every type but IQ1_M's IQ2_XS/IQ2_S pairs sets both alike */
    switch (type) {
    case LC_IQ4_NL:
    case LC_IQ4_XS: {
        float d = lc_f16(lc_u16(b));
        const uint8_t *qs = type == LC_IQ4_NL ? b + 2 : b + 8 + 16 * s;
        if (type == LC_IQ4_XS) {
            int q = ((b[4 + s / 2] >> (4 * (s % 2))) & 15) | (((lc_u16(b + 2) >> (2 * s)) & 3) << 4);
            d = d * (float)(q - 32);
        }
        for (int j = 0; j < 16; j++) {
            v[j] = lc_iq4nl_values[qs[j] & 15];
            v[j + 16] = lc_iq4nl_values[qs[j] >> 4];
        }
        sc[0] = sc[1] = d;
        break;
    }
    case LC_NVFP4:
    case LC_Q1_0:
    case LC_Q2_0: lc_lb_dec(type, b, s, v, sc); break; /* lc_lowbit.h */
    case LC_MXFP4: /* lc_mxfp4.h */
        for (int j = 0; j < 16; j++) {
            v[j] = lc_mxfp4_values[b[1 + j] & 15];
            v[j + 16] = lc_mxfp4_values[b[1 + j] >> 4];
        }
        sc[0] = sc[1] = lc_e8m0_half(b[0]);
        break;
    case LC_IQ2_XXS: {
        const uint8_t *q = b + 2 + 8 * s;
        uint32_t aux = lc_u32(q + 4);
        sc[0] = sc[1] = lc_f16(lc_u16(b)) * (0.5f + (float)(aux >> 28)) * 0.25f;
        for (int l = 0; l < 4; l++) lc_iq_signed8(lc_iq2xxs_grid[q[l]], lc_iq_ksigns[(aux >> (7 * l)) & 127], v + 8 * l);
        break;
    }
    case LC_IQ2_XS: {
        float d = lc_f16(lc_u16(b));
        uint8_t scales = b[66 + s];
        sc[0] = d * (0.5f + (float)(scales & 15)) * 0.25f;
        sc[1] = d * (0.5f + (float)(scales >> 4)) * 0.25f;
        for (int l = 0; l < 4; l++) {
            uint16_t q = lc_u16(b + 2 + 8 * s + 2 * l);
            lc_iq_signed8(lc_iq2xs_grid[q & 511], lc_iq_ksigns[q >> 9], v + 8 * l);
        }
        break;
    }
    case LC_IQ2_S: {
        float d = lc_f16(lc_u16(b));
        uint8_t scales = b[74 + s], qh = b[66 + s];
        sc[0] = d * (0.5f + (float)(scales & 15)) * 0.25f;
        sc[1] = d * (0.5f + (float)(scales >> 4)) * 0.25f;
        for (int l = 0; l < 4; l++) {
            int idx = b[2 + 4 * s + l] | (((qh >> (2 * l)) & 3) << 8);
            lc_iq_signed8(lc_iq2s_grid[idx], b[34 + 4 * s + l], v + 8 * l);
        }
        break;
    }
    case LC_IQ3_XXS: {
        uint32_t aux = lc_u32(b + 66 + 4 * s);
        sc[0] = sc[1] = lc_f16(lc_u16(b)) * (0.5f + (float)(aux >> 28)) * 0.5f;
        const uint8_t *qs = b + 2 + 8 * s;
        for (int l = 0; l < 4; l++) {
            int8_t g[8];
            memcpy(g, lc_iq3xxs_grid[qs[2 * l]], 4);
            memcpy(g + 4, lc_iq3xxs_grid[qs[2 * l + 1]], 4);
            lc_iq_signed8(g, lc_iq_ksigns[(aux >> (7 * l)) & 127], v + 8 * l);
        }
        break;
    }
    case LC_IQ3_S: {
        const uint8_t *qs = b + 2 + 8 * s;
        uint8_t qh = b[66 + s];
        sc[0] = sc[1] = lc_f16(lc_u16(b)) * (float)(1 + 2 * ((b[106 + s / 2] >> (4 * (s % 2))) & 15));
        for (int l = 0; l < 4; l++) {
            int8_t g[8];
            memcpy(g, lc_iq3s_grid[qs[2 * l] | (((qh >> (2 * l)) & 1) << 8)], 4);
            memcpy(g + 4, lc_iq3s_grid[qs[2 * l + 1] | (((qh >> (2 * l + 1)) & 1) << 8)], 4);
            lc_iq_signed8(g, b[74 + 4 * s + l], v + 8 * l);
        }
        break;
    }
    case LC_IQ1_S: {
        uint16_t qh = lc_u16(b + 34 + 2 * s);
        sc[0] = sc[1] = lc_f16(lc_u16(b)) * (float)(2 * ((qh >> 12) & 7) + 1) * 0.125f;
        int shift = qh & 0x8000 ? -1 : 1; /* delta -1/8 or +1/8, in eighths */
        for (int l = 0; l < 4; l++) {
            const int8_t *g = lc_iq1s_grid[b[2 + 4 * s + l] | (((qh >> (3 * l)) & 7) << 8)];
            for (int j = 0; j < 8; j++) v[8 * l + j] = (int8_t)(8 * g[j] + shift);
        }
        break;
    }
    case LC_IQ1_M: {
        uint16_t s0 = lc_u16(b + 48), s1 = lc_u16(b + 50), s2 = lc_u16(b + 52), s3 = lc_u16(b + 54);
        float d = lc_f16((uint16_t)((s0 >> 12) | ((s1 >> 8) & 0xF0) | ((s2 >> 4) & 0xF00) | (s3 & 0xF000)));
        for (int h = 0; h < 2; h++) {
            int i = 2 * s + h; /* the 3-bit scale of each 16 values, four per 16-bit word */
            sc[h] = d * (float)(2 * ((lc_u16(b + 48 + 2 * (i / 4)) >> (3 * (i % 4))) & 7) + 1) * 0.125f;
        }
        for (int l = 0; l < 4; l++) {
            int nib = (b[32 + 2 * s + l / 2] >> (4 * (l % 2))) & 15;
            const int8_t *g = lc_iq1s_grid[b[4 * s + l] | ((nib & 7) << 8)];
            int shift = nib & 8 ? -1 : 1;
            for (int j = 0; j < 8; j++) v[8 * l + j] = (int8_t)(8 * g[j] + shift);
        }
        break;
    }
    case LC_TQ1_0: {
        static const uint8_t pow3[5] = {1, 3, 9, 27, 81};
        for (int j = 0; j < 32; j++) {
            int i = 32 * s + j, byte, n;
            if (i < 160) { n = i / 32; byte = i % 32; }
            else if (i < 240) { n = (i - 160) / 16; byte = 32 + (i - 160) % 16; }
            else { n = (i - 240) / 4; byte = 48 + (i - 240) % 4; }
            uint8_t q = (uint8_t)(b[byte] * pow3[n]); /* the base-3 digit n, scaled to the byte's top */
            v[j] = (int8_t)(((q * 3) >> 8) - 1);
        }
        sc[0] = sc[1] = lc_f16(lc_u16(b + 52));
        break;
    }
    default: { /* LC_TQ2_0 */
        const uint8_t *qs = b + 32 * (s / 4);
        int shift = 2 * (s % 4);
        for (int j = 0; j < 32; j++) v[j] = (int8_t)(((qs[j] >> shift) & 3) - 1);
        sc[0] = sc[1] = lc_f16(lc_u16(b + 64));
        break;
    }
    }
    for (int l = 0; l < 8; l++) ls[l] = sc[l / 4];
}

/* Sub-block `s` of a row: its block and the sub-block's index within it. */
static inline void lc_iq_dec_row(int type, const uint8_t *row, int64_t s, int8_t *v, float *ls) {
    if (type == LC_IQ4_NL || type == LC_MXFP4) lc_iq_dec(type, row + lc_block_bytes(type) * s, 0, v, ls);
    else lc_iq_dec(type, row + lc_block_bytes(type) * (s / lc_block_subs(type)), (int)(s % lc_block_subs(type)), v, ls);
}

/* out [r, k] = rows ids of an i-quant matrix, dequantized. */
static void lc_iq_dequant(int type, const uint8_t *w, int64_t k, int64_t row_bytes, const int64_t *ids, int64_t r,
                          void *out, int out_bf16) {
    int8_t v[32];
    float ls[8];
    for (int64_t i = 0; i < r; i++)
        for (int64_t s = 0; s < k / 32; s++) {
            lc_iq_dec_row(type, w + ids[i] * row_bytes, s, v, ls);
            for (int j = 0; j < 32; j++) lc_store(out, out_bf16, i * k + 32 * s + j, ls[j / 4] * (float)v[j]);
        }
}
#endif /* LC_IQ_COMMON */
#include "lc_lowbit.h" /* its per-ISA decoders */

#if LC_ISA == LC_ISA_AVX2 || LC_ISA == LC_ISA_AVX512VNNI
/* 8 int32 lanes: lane l = sum of v[4l..4l+3] * x[4l..4l+3], both signed (|v|, |x| <= 127: the int16 pair
   sums of maddubs cannot saturate). */
static inline __m256i LC_FN(iq_dot32)(__m256i v, __m256i x) {
#if LC_ISA == LC_ISA_AVX512VNNI
    return _mm256_dpbusd_epi32(_mm256_setzero_si256(), _mm256_sign_epi8(v, v), _mm256_sign_epi8(x, v));
#else
    __m256i p = _mm256_maddubs_epi16(_mm256_sign_epi8(v, v), _mm256_sign_epi8(x, v));
    return _mm256_madd_epi16(p, _mm256_set1_epi16(1));
#endif
}

/* IQ4_NL / IQ4_XS / MXFP4: 16 bytes of nibbles (values j and j + 16 share byte j) -> 32 signed values in
   order, looked up in the type's 16 values. */
static inline __m256i LC_FN(iq4_values)(const uint8_t *qs, const int8_t *values) {
    const __m256i table = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)values));
    __m128i q = _mm_loadu_si128((const __m128i *)qs), mask = _mm_set1_epi8(15);
    __m256i idx = _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(q, 4), mask), _mm_and_si128(q, mask));
    return _mm256_shuffle_epi8(table, idx);
}

/* The 256-value block types (IQ2/IQ3 grids, IQ1, ternary): sub-block i (0..7) of block b. */

/* Whether a sub-block of `type` decodes to unsigned grid magnitudes and a sign mask (the IQ2/IQ3 grids:
   every value nonzero, at most 62) rather than to signed values. The dot product then flips the signs of
   the activations instead (one masked subtract on AVX-512) and multiplies unsigned by signed directly. */
static inline int LC_FN(iq_mags)(int type) {
    return type == LC_IQ2_XXS || type == LC_IQ2_XS || type == LC_IQ2_S || type == LC_IQ3_XXS || type == LC_IQ3_S;
}

/* x with the bytes whose bit is set in `signs` negated (|x| <= 127). */
static inline __m256i LC_FN(iq_flip)(__m256i x, uint32_t signs) {
#if LC_ISA == LC_ISA_AVX512VNNI
    return _mm256_mask_sub_epi8(x, (__mmask32)signs, _mm256_setzero_si256(), x);
#else /* the sign bits spread to byte masks m, then (x ^ m) - m */
    const __m256i spread = _mm256_setr_epi64x(0, 0x0101010101010101LL, 0x0202020202020202LL, 0x0303030303030303LL);
    const __m256i bits = _mm256_set1_epi64x((int64_t)0x8040201008040201ULL);
    __m256i m = _mm256_shuffle_epi8(_mm256_set1_epi32((int)signs), spread);
    m = _mm256_cmpeq_epi8(_mm256_and_si256(m, bits), bits);
    return _mm256_sub_epi8(_mm256_xor_si256(x, m), m);
#endif
}

/* As iq_dot32 for unsigned g (<= 127) times signed x. */
static inline __m256i LC_FN(iq_dotu)(__m256i g, __m256i x) {
#if LC_ISA == LC_ISA_AVX512VNNI
    return _mm256_dpbusd_epi32(_mm256_setzero_si256(), g, x);
#else
    return _mm256_madd_epi16(_mm256_maddubs_epi16(g, x), _mm256_set1_epi16(1));
#endif
}

static inline uint64_t LC_FN(iq_u64)(const int8_t *p) {
    uint64_t r;
    memcpy(&r, p, 8);
    return r;
}

static inline int32_t LC_FN(iq_i32)(const int8_t *p) {
    int32_t r;
    memcpy(&r, p, 4);
    return r;
}

/* The scales of the two 16-value halves of sub-block i: lc_iq_dec's float32 expressions (F16C converts
   the float16 scale exactly, as lc_f16 does). */
static inline __attribute__((always_inline)) void LC_FN(iq_sscale)(const int type, const uint8_t *b, int i,
                                                                    float *s0, float *s1) {
    switch (type) {
    case LC_IQ2_XXS:
        *s0 = *s1 = _cvtsh_ss(lc_u16(b)) * (0.5f + (float)(lc_u32(b + 6 + 8 * i) >> 28)) * 0.25f;
        break;
    case LC_IQ2_XS:
    case LC_IQ2_S: {
        float d = _cvtsh_ss(lc_u16(b));
        uint8_t scales = b[(type == LC_IQ2_XS ? 66 : 74) + i];
        *s0 = d * (0.5f + (float)(scales & 15)) * 0.25f;
        *s1 = d * (0.5f + (float)(scales >> 4)) * 0.25f;
        break;
    }
    case LC_IQ3_XXS:
        *s0 = *s1 = _cvtsh_ss(lc_u16(b)) * (0.5f + (float)(lc_u32(b + 66 + 4 * i) >> 28)) * 0.5f;
        break;
    case LC_IQ3_S:
        *s0 = *s1 = _cvtsh_ss(lc_u16(b)) * (float)(1 + 2 * ((b[106 + i / 2] >> (4 * (i % 2))) & 15));
        break;
    case LC_IQ1_S:
        *s0 = *s1 = _cvtsh_ss(lc_u16(b)) * (float)(2 * ((lc_u16(b + 34 + 2 * i) >> 12) & 7) + 1) * 0.125f;
        break;
    case LC_IQ1_M: {
        uint16_t w0 = lc_u16(b + 48), w1 = lc_u16(b + 50), w2 = lc_u16(b + 52), w3 = lc_u16(b + 54);
        float d = _cvtsh_ss((uint16_t)((w0 >> 12) | ((w1 >> 8) & 0xF0) | ((w2 >> 4) & 0xF00) | (w3 & 0xF000)));
        uint16_t w = lc_u16(b + 48 + 2 * (i / 2)); /* the 3-bit scales of 16 values, four per word */
        *s0 = d * (float)(2 * ((w >> (6 * (i % 2))) & 7) + 1) * 0.125f;
        *s1 = d * (float)(2 * ((w >> (6 * (i % 2) + 3)) & 7) + 1) * 0.125f;
        break;
    }
    case LC_TQ1_0: *s0 = *s1 = _cvtsh_ss(lc_u16(b + 52)); break;
    default: *s0 = *s1 = _cvtsh_ss(lc_u16(b + 64)); break; /* LC_TQ2_0 */
    }
}

/* TQ1_0: digit n of bytes x (their base-3 value times 3^n, the top of the byte) with p = 3^n per byte:
   ((x * p mod 256) * 3 >> 8) - 1, in 16-bit halves (there is no byte multiply). */
static inline __m256i LC_FN(tq1_digits)(__m256i x, __m256i p) {
    const __m256i lo8 = _mm256_set1_epi16(0x00FF), three = _mm256_set1_epi16(3);
    __m256i ql = _mm256_and_si256(_mm256_mullo_epi16(_mm256_and_si256(x, lo8), _mm256_and_si256(p, lo8)), lo8);
    __m256i qh = _mm256_and_si256(_mm256_mullo_epi16(_mm256_srli_epi16(x, 8), _mm256_srli_epi16(p, 8)), lo8);
    ql = _mm256_srli_epi16(_mm256_mullo_epi16(ql, three), 8);
    qh = _mm256_andnot_si256(lo8, _mm256_mullo_epi16(qh, three));
    return _mm256_sub_epi8(_mm256_or_si256(ql, qh), _mm256_set1_epi8(1));
}

/* Sub-block i of block b in registers: for the grid types (iq_mags) the 32 magnitudes and *signs (bit j:
   value j negative), else the 32 signed values. Grid rows are loaded whole and inserted (no stack copy:
   narrow stores read back wide stall store forwarding). */
static inline __attribute__((always_inline)) void LC_FN(iq_gsub)(const int type, const uint8_t *b, int i,
                                                                  __m256i *v, uint32_t *signs) {
    switch (type) {
    case LC_IQ2_XXS: {
        const uint8_t *q = b + 2 + 8 * i;
        *v = _mm256_setr_epi64x((int64_t)LC_FN(iq_u64)(lc_iq2xxs_grid[q[0]]), (int64_t)LC_FN(iq_u64)(lc_iq2xxs_grid[q[1]]),
                                (int64_t)LC_FN(iq_u64)(lc_iq2xxs_grid[q[2]]), (int64_t)LC_FN(iq_u64)(lc_iq2xxs_grid[q[3]]));
        *signs = lc_iq_ksigns4(lc_u32(q + 4));
        break;
    }
    case LC_IQ2_XS: {
        uint16_t q[4];
        memcpy(q, b + 2 + 8 * i, 8);
        *v = _mm256_setr_epi64x((int64_t)LC_FN(iq_u64)(lc_iq2xs_grid[q[0] & 511]), (int64_t)LC_FN(iq_u64)(lc_iq2xs_grid[q[1] & 511]),
                                (int64_t)LC_FN(iq_u64)(lc_iq2xs_grid[q[2] & 511]), (int64_t)LC_FN(iq_u64)(lc_iq2xs_grid[q[3] & 511]));
        *signs = (uint32_t)lc_iq_ksigns[q[0] >> 9] | ((uint32_t)lc_iq_ksigns[q[1] >> 9] << 8) |
                 ((uint32_t)lc_iq_ksigns[q[2] >> 9] << 16) | ((uint32_t)lc_iq_ksigns[q[3] >> 9] << 24);
        break;
    }
    case LC_IQ2_S: {
        const uint8_t *qs = b + 2 + 4 * i;
        unsigned qh = b[66 + i];
        *v = _mm256_setr_epi64x((int64_t)LC_FN(iq_u64)(lc_iq2s_grid[qs[0] | ((qh & 3) << 8)]),
                                (int64_t)LC_FN(iq_u64)(lc_iq2s_grid[qs[1] | ((qh & 12) << 6)]),
                                (int64_t)LC_FN(iq_u64)(lc_iq2s_grid[qs[2] | ((qh & 48) << 4)]),
                                (int64_t)LC_FN(iq_u64)(lc_iq2s_grid[qs[3] | ((qh & 192) << 2)]));
        *signs = lc_u32(b + 34 + 4 * i);
        break;
    }
    case LC_IQ3_XXS: {
        const uint8_t *qs = b + 2 + 8 * i;
        *v = _mm256_setr_epi32(LC_FN(iq_i32)(lc_iq3xxs_grid[qs[0]]), LC_FN(iq_i32)(lc_iq3xxs_grid[qs[1]]),
                               LC_FN(iq_i32)(lc_iq3xxs_grid[qs[2]]), LC_FN(iq_i32)(lc_iq3xxs_grid[qs[3]]),
                               LC_FN(iq_i32)(lc_iq3xxs_grid[qs[4]]), LC_FN(iq_i32)(lc_iq3xxs_grid[qs[5]]),
                               LC_FN(iq_i32)(lc_iq3xxs_grid[qs[6]]), LC_FN(iq_i32)(lc_iq3xxs_grid[qs[7]]));
        *signs = lc_iq_ksigns4(lc_u32(b + 66 + 4 * i));
        break;
    }
    case LC_IQ3_S: {
        const uint8_t *qs = b + 2 + 8 * i;
        unsigned qh = b[66 + i];
        *v = _mm256_setr_epi32(
            LC_FN(iq_i32)(lc_iq3s_grid[qs[0] | ((qh & 1) << 8)]), LC_FN(iq_i32)(lc_iq3s_grid[qs[1] | ((qh & 2) << 7)]),
            LC_FN(iq_i32)(lc_iq3s_grid[qs[2] | ((qh & 4) << 6)]), LC_FN(iq_i32)(lc_iq3s_grid[qs[3] | ((qh & 8) << 5)]),
            LC_FN(iq_i32)(lc_iq3s_grid[qs[4] | ((qh & 16) << 4)]), LC_FN(iq_i32)(lc_iq3s_grid[qs[5] | ((qh & 32) << 3)]),
            LC_FN(iq_i32)(lc_iq3s_grid[qs[6] | ((qh & 64) << 2)]), LC_FN(iq_i32)(lc_iq3s_grid[qs[7] | ((qh & 128) << 1)]));
        *signs = lc_u32(b + 74 + 4 * i);
        break;
    }
    case LC_IQ1_S:
    case LC_IQ1_M: { /* 8 g + shift, g in {-1, 0, 1}: sign(8, g) + shift (+1 or -1 per 8 values) */
        uint32_t idx[4];
        int64_t neg[4];
        if (type == LC_IQ1_S) {
            uint16_t qh = lc_u16(b + 34 + 2 * i);
            for (int l = 0; l < 4; l++) {
                idx[l] = b[2 + 4 * i + l] | (((qh >> (3 * l)) & 7u) << 8);
                neg[l] = qh & 0x8000 ? -1 : 0;
            }
        } else {
            uint16_t nib = lc_u16(b + 32 + 2 * i); /* four 4-bit fields: 3 grid bits, then the shift's sign */
            for (int l = 0; l < 4; l++) {
                idx[l] = b[4 * i + l] | (((nib >> (4 * l)) & 7u) << 8);
                neg[l] = nib & (8u << (4 * l)) ? -1 : 0;
            }
        }
        __m256i g = _mm256_setr_epi64x((int64_t)LC_FN(iq_u64)(lc_iq1s_grid[idx[0]]), (int64_t)LC_FN(iq_u64)(lc_iq1s_grid[idx[1]]),
                                       (int64_t)LC_FN(iq_u64)(lc_iq1s_grid[idx[2]]), (int64_t)LC_FN(iq_u64)(lc_iq1s_grid[idx[3]]));
        __m256i m = _mm256_setr_epi64x(neg[0], neg[1], neg[2], neg[3]); /* -1 bytes where the shift is -1 */
        __m256i shift = _mm256_or_si256(m, _mm256_set1_epi8(1));
        *v = _mm256_add_epi8(_mm256_sign_epi8(_mm256_set1_epi8(8), g), shift);
        break;
    }
    case LC_TQ1_0: {
        __m256i x, p;
        if (i < 5) {
            x = _mm256_loadu_si256((const __m256i *)b);
            p = _mm256_set1_epi8((char)(i == 0 ? 1 : i == 1 ? 3 : i == 2 ? 9 : i == 3 ? 27 : 81));
        } else if (i < 7) {
            x = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)(b + 32)));
            p = i == 5 ? _mm256_setr_m128i(_mm_set1_epi8(1), _mm_set1_epi8(3))
                       : _mm256_setr_m128i(_mm_set1_epi8(9), _mm_set1_epi8(27));
        } else { /* values 224..239: digit 4 of bytes 32..47; 240..255: digits 0..3 of bytes 48..51 */
            x = _mm256_setr_m128i(_mm_loadu_si128((const __m128i *)(b + 32)), _mm_set1_epi32((int)lc_u32(b + 48)));
            p = _mm256_setr_m128i(_mm_set1_epi8(81), _mm_setr_epi32(0x01010101, 0x03030303, 0x09090909, 0x1B1B1B1B));
        }
        *v = LC_FN(tq1_digits)(x, p);
        break;
    }
    default: { /* LC_TQ2_0: 2-bit fields, four sub-blocks per 32 bytes */
        __m256i q = _mm256_srl_epi16(_mm256_loadu_si256((const __m256i *)(b + 32 * (i / 4))), _mm_cvtsi32_si128(2 * (i % 4)));
        *v = _mm256_sub_epi8(_mm256_and_si256(q, _mm256_set1_epi8(3)), _mm256_set1_epi8(1));
        break;
    }
    }
}

/* IQ3_XXS: a block's 8 words of four 7-bit sign indices (and a 4-bit scale) -> 8 sign words, each index
   spread to a byte and given its parity as bit 7 (lc_iq_ksigns in registers, all 32 at once). */
static inline void LC_FN(iq3xxs_signs)(__m256i aux, uint32_t *signs) {
    __m256i s = _mm256_or_si256(_mm256_or_si256(_mm256_and_si256(aux, _mm256_set1_epi32(0x7F)),
                                                _mm256_and_si256(_mm256_slli_epi32(aux, 1), _mm256_set1_epi32(0x7F00))),
                                _mm256_or_si256(_mm256_and_si256(_mm256_slli_epi32(aux, 2), _mm256_set1_epi32(0x7F0000)),
                                                _mm256_and_si256(_mm256_slli_epi32(aux, 3), _mm256_set1_epi32(0x7F000000))));
    __m256i p = _mm256_xor_si256(s, _mm256_srli_epi32(s, 4)); /* bit 0 of each byte: the byte's parity */
    p = _mm256_xor_si256(p, _mm256_srli_epi32(p, 2));
    p = _mm256_xor_si256(p, _mm256_srli_epi32(p, 1));
    s = _mm256_or_si256(s, _mm256_slli_epi32(_mm256_and_si256(p, _mm256_set1_epi32(0x01010101)), 7));
    _mm256_storeu_si256((__m256i *)signs, s);
}

/* The lane scales of a sub-block whose halves scale by s0 and s1. */
static inline __m256 LC_FN(iq_lanes)(float s0, float s1) {
    return _mm256_setr_m128(_mm_set1_ps(s0), _mm_set1_ps(s1));
}

/* Sub-block s of a row in registers: 32 signed values and the scale of each 4-value lane (the row-at-a-time
   IQ4 kernel and lc_iq_gemm.h's panels). The scales keep lc_iq_dec's float32 expressions, so both decoders
   give the same bits. */
static inline __attribute__((always_inline)) void LC_FN(iq_sub)(const int type, const uint8_t *row, int64_t s,
                                                                 __m256i *v, __m256 *lsv) {
    if (type == LC_IQ4_NL) {
        const uint8_t *b = row + 18 * s;
        *v = LC_FN(iq4_values)(b + 2, lc_iq4nl_values);
        *lsv = _mm256_set1_ps(_cvtsh_ss(lc_u16(b)));
    } else if (type == LC_MXFP4) {
        const uint8_t *b = row + 17 * s;
        *v = LC_FN(iq4_values)(b + 1, lc_mxfp4_values);
        *lsv = _mm256_set1_ps(lc_e8m0_half(b[0]));
    } else if (lc_is_lowbit(type)) {
        LC_FN(lb_sub)(type, row, s, v, lsv);
    } else if (type == LC_IQ4_XS) {
        const uint8_t *b = row + 136 * (s / 8);
        int i = (int)(s % 8);
        int q = ((b[4 + i / 2] >> (4 * (i % 2))) & 15) | (((lc_u16(b + 2) >> (2 * i)) & 3) << 4);
        *v = LC_FN(iq4_values)(b + 8 + 16 * i, lc_iq4nl_values);
        *lsv = _mm256_set1_ps(_cvtsh_ss(lc_u16(b)) * (float)(q - 32));
    } else {
        const uint8_t *b = row + lc_block_bytes(type) * (s / 8);
        int i = (int)(s % 8);
        uint32_t signs = 0;
        float s0, s1;
        LC_FN(iq_gsub)(type, b, i, v, &signs);
        if (LC_FN(iq_mags)(type)) *v = LC_FN(iq_flip)(*v, signs);
        LC_FN(iq_sscale)(type, b, i, &s0, &s1);
        *lsv = LC_FN(iq_lanes)(s0, s1);
    }
}

/* Row `row` of the weights times activation rows xq/xd [mr] (a literal after inlining, so the accumulators
   stay in registers): res[i]. Two accumulators per row (even and odd sub-blocks) halve the chain of
   dependent FMAs a one-row step is bound by. */
static inline __attribute__((always_inline)) void LC_FN(iq_row)(const int type, const int mr, const uint8_t *row,
                                                                 int64_t k, const int8_t *xq, const float *xd,
                                                                 float *res) {
    __m256 acc[4][2];
    for (int i = 0; i < 4; i++) acc[i][0] = acc[i][1] = _mm256_setzero_ps();
    int64_t subs = k / 32, s = 0;
    for (; s + 2 <= subs; s += 2) {
        __m256i v0, v1;
        __m256 l0, l1;
        LC_FN(iq_sub)(type, row, s, &v0, &l0);
        LC_FN(iq_sub)(type, row, s + 1, &v1, &l1);
        for (int i = 0; i < mr; i++) {
            const int8_t *x = xq + i * k + 32 * s;
            const float *dx = xd + i * (k / 4) + 8 * s;
            __m256i p0 = LC_FN(iq_dot32)(v0, _mm256_loadu_si256((const __m256i *)x));
            __m256i p1 = LC_FN(iq_dot32)(v1, _mm256_loadu_si256((const __m256i *)(x + 32)));
            acc[i][0] = _mm256_fmadd_ps(_mm256_mul_ps(l0, _mm256_loadu_ps(dx)), _mm256_cvtepi32_ps(p0), acc[i][0]);
            acc[i][1] = _mm256_fmadd_ps(_mm256_mul_ps(l1, _mm256_loadu_ps(dx + 8)), _mm256_cvtepi32_ps(p1), acc[i][1]);
        }
    }
    if (s < subs) { /* an odd last sub-block (IQ4_NL rows of 32 * odd values) */
        __m256i v0;
        __m256 l0;
        LC_FN(iq_sub)(type, row, s, &v0, &l0);
        for (int i = 0; i < mr; i++) {
            __m256i p0 = LC_FN(iq_dot32)(v0, _mm256_loadu_si256((const __m256i *)(xq + i * k + 32 * s)));
            __m256 f = _mm256_mul_ps(l0, _mm256_loadu_ps(xd + i * (k / 4) + 8 * s));
            acc[i][0] = _mm256_fmadd_ps(f, _mm256_cvtepi32_ps(p0), acc[i][0]);
        }
    }
    for (int i = 0; i < mr; i++) res[i] = LC_FN(hsum)(_mm256_add_ps(acc[i][0], acc[i][1]));
}

/* As iq_row for the 256-value block types, a block at a time with `type` a literal: the grid types multiply
   their unsigned magnitudes by the activations with the weights' signs applied (iq_mags), the others their
   signed values. */
static inline __attribute__((always_inline)) void LC_FN(iq_brow)(const int type, const int mr, const uint8_t *row,
                                                                  int64_t k, const int8_t *xq, const float *xd,
                                                                  float *res) {
    const int64_t bytes = lc_block_bytes(type);
    __m256 acc[4][2];
    for (int i = 0; i < 4; i++) acc[i][0] = acc[i][1] = _mm256_setzero_ps();
    for (int64_t ib = 0; ib < k / 256; ib++) {
        const uint8_t *b = row + bytes * ib;
        uint32_t signs[8];
        if (type == LC_IQ3_XXS) LC_FN(iq3xxs_signs)(_mm256_loadu_si256((const __m256i *)(b + 66)), signs);
        for (int j = 0; j < 8; j += 2) {
            __m256i v0, v1;
            uint32_t sg0 = 0, sg1 = 0;
            float a0, a1, c0, c1;
            LC_FN(iq_gsub)(type, b, j, &v0, &sg0);
            LC_FN(iq_gsub)(type, b, j + 1, &v1, &sg1);
            if (type == LC_IQ3_XXS) sg0 = signs[j], sg1 = signs[j + 1];
            LC_FN(iq_sscale)(type, b, j, &a0, &a1);
            LC_FN(iq_sscale)(type, b, j + 1, &c0, &c1);
            __m256 l0 = LC_FN(iq_lanes)(a0, a1), l1 = LC_FN(iq_lanes)(c0, c1);
            for (int i = 0; i < mr; i++) {
                const int8_t *x = xq + i * k + 256 * ib + 32 * j;
                const float *dx = xd + i * (k / 4) + 64 * ib + 8 * j;
                __m256i x0 = _mm256_loadu_si256((const __m256i *)x), x1 = _mm256_loadu_si256((const __m256i *)(x + 32));
                __m256i p0, p1;
                if (LC_FN(iq_mags)(type)) {
                    p0 = LC_FN(iq_dotu)(v0, LC_FN(iq_flip)(x0, sg0));
                    p1 = LC_FN(iq_dotu)(v1, LC_FN(iq_flip)(x1, sg1));
                } else {
                    p0 = LC_FN(iq_dot32)(v0, x0);
                    p1 = LC_FN(iq_dot32)(v1, x1);
                }
                acc[i][0] = _mm256_fmadd_ps(_mm256_mul_ps(l0, _mm256_loadu_ps(dx)), _mm256_cvtepi32_ps(p0), acc[i][0]);
                acc[i][1] = _mm256_fmadd_ps(_mm256_mul_ps(l1, _mm256_loadu_ps(dx + 8)), _mm256_cvtepi32_ps(p1), acc[i][1]);
            }
        }
    }
    for (int i = 0; i < mr; i++) res[i] = LC_FN(hsum)(_mm256_add_ps(acc[i][0], acc[i][1]));
}

/* IQ4_XS's 8 sub-block scales d * (q - 32) of block b, from vector code once per block: the per-32 scalar
   unpacking of iq_sub (two byte loads, shifts, a float16 conversion) was most of a one-row step, which made
   the 8B file's decode compute-bound at ~11 GB/s a core against ~40 GB/s DRAM. Same float32 expression as
   lc_iq_dec, so the same bits. */
static inline __m256 LC_FN(iq4xs_scales)(const uint8_t *b) {
    __m256i lo = _mm256_srlv_epi32(_mm256_set1_epi32((int)lc_u32(b + 4)), _mm256_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28));
    __m256i hi = _mm256_srlv_epi32(_mm256_set1_epi32((int)lc_u16(b + 2)), _mm256_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14));
    __m256i q = _mm256_or_si256(_mm256_and_si256(lo, _mm256_set1_epi32(15)),
                                _mm256_slli_epi32(_mm256_and_si256(hi, _mm256_set1_epi32(3)), 4));
    return _mm256_mul_ps(_mm256_set1_ps(_cvtsh_ss(lc_u16(b))), _mm256_cvtepi32_ps(_mm256_sub_epi32(q, _mm256_set1_epi32(32))));
}

/* IQ4_XS rows: blocks of `row` times activation rows xq [mr, k] with their per-32 scales dx [mr, k / 32]
   (lc_x16_summaries' dx32: a 256-bit load per block instead of lc_quantize's scale repeated per 4 values,
   which at k = 14336 made the activations 28 KiB against a 48 KiB L1 and the down projection 45% slower a
   byte than the others). The next blocks are prefetched LC_IQ4_PF bytes ahead: at k = 14336 the hardware
   prefetcher alone left 2-thread streaming at ~25 GB/s (29 with it, 1,024 bytes ahead). */
#ifndef LC_IQ4_PF
#define LC_IQ4_PF 1024
#endif
/* Block b's prologue, shared by both ISAs' iq4xs_brow: the prefetch of the bytes LC_IQ4_PF ahead and cs[i],
   the block's 8 sub-block scales times activation row i's 8 scales (dx row i, [k / 32]). */
static inline __attribute__((always_inline)) void LC_FN(iq4xs_pre)(const int mr, const uint8_t *b, int64_t k,
                                                                    const float *dx, __m256 *cs) {
    _mm_prefetch((const char *)b + LC_IQ4_PF, _MM_HINT_T0);
    _mm_prefetch((const char *)b + LC_IQ4_PF + 64, _MM_HINT_T0);
    _mm_prefetch((const char *)b + LC_IQ4_PF + 128, _MM_HINT_T0);
    const __m256 sc = LC_FN(iq4xs_scales)(b);
    for (int i = 0; i < mr; i++) cs[i] = _mm256_mul_ps(sc, _mm256_loadu_ps(dx + i * (k / 32)));
}
#if LC_ISA == LC_ISA_AVX512VNNI
/* AVX-512: two sub-blocks (64 values) per 512-bit step: their 32 bytes of nibbles spread to four 128-bit
   lanes (low and high nibbles of each), one vpshufb of the values' magnitudes, the signs (the table's first
   8 entries are the negative ones) flipping the activations under a 64-bit mask, one vpdpbusd and one
   float FMA per activation row. Two chains per row. */
static inline __attribute__((always_inline)) void LC_FN(iq4xs_brow)(const int mr, const uint8_t *row, int64_t k,
                                                                     const int8_t *xq, const float *dx, float *res) {
    __m512 acc[4][2];
    for (int i = 0; i < 4; i++) acc[i][0] = acc[i][1] = _mm512_setzero_ps();
    /* |lc_iq4nl_values| */
    const __m512i table = _mm512_broadcast_i32x4(_mm_setr_epi8(127, 104, 83, 65, 49, 35, 22, 10, 1, 13, 25, 38, 53, 69, 89, 113));
    const __m512i low4 = _mm512_set1_epi8(15), eight = _mm512_set1_epi8(8);
    const __m512i pick0 = _mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1);
    for (int64_t ib = 0; ib < k / 256; ib++) {
        const uint8_t *b = row + 136 * ib;
        __m256 cs[4]; /* weight scale times activation scale of each sub-block */
        LC_FN(iq4xs_pre)(mr, b, k, dx + 8 * ib, cs);
        for (int j = 0; j < 8; j += 2) {
            __m512i q = _mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)(b + 8 + 16 * j)));
            q = _mm512_shuffle_i64x2(q, q, 0x50); /* lanes: sub j, sub j, sub j + 1, sub j + 1 */
            q = _mm512_and_si512(_mm512_mask_srli_epi16(q, (__mmask32)0xFF00FF00u, q, 4), low4);
            const __m512i g = _mm512_shuffle_epi8(table, q);
            const __mmask64 neg = _mm512_testn_epi8_mask(q, eight);
            const __m512i pick = _mm512_add_epi32(pick0, _mm512_set1_epi32(j));
            for (int i = 0; i < mr; i++) {
                __m512i x = _mm512_loadu_si512((const void *)(xq + i * k + 256 * ib + 32 * j));
                x = _mm512_mask_sub_epi8(x, neg, _mm512_setzero_si512(), x);
                __m512i p = _mm512_dpbusd_epi32(_mm512_setzero_si512(), g, x);
                acc[i][j >> 1 & 1] = _mm512_fmadd_ps(_mm512_permutexvar_ps(pick, _mm512_castps256_ps512(cs[i])),
                                                     _mm512_cvtepi32_ps(p), acc[i][j >> 1 & 1]);
            }
        }
    }
    for (int i = 0; i < mr; i++) res[i] = _mm512_reduce_add_ps(_mm512_add_ps(acc[i][0], acc[i][1]));
}
#else
/* AVX2: a block at a time, each sub-block's combined scale permuted out of the block's 8. Same products
   and order as iq_row, so the same bits. */
static inline __attribute__((always_inline)) void LC_FN(iq4xs_brow)(const int mr, const uint8_t *row, int64_t k,
                                                                     const int8_t *xq, const float *dx, float *res) {
    __m256 acc[4][2];
    for (int i = 0; i < 4; i++) acc[i][0] = acc[i][1] = _mm256_setzero_ps();
    for (int64_t ib = 0; ib < k / 256; ib++) {
        const uint8_t *b = row + 136 * ib;
        __m256 cs[4];
        LC_FN(iq4xs_pre)(mr, b, k, dx + 8 * ib, cs);
        for (int j = 0; j < 8; j++) {
            const __m256i v = LC_FN(iq4_values)(b + 8 + 16 * j, lc_iq4nl_values);
            for (int i = 0; i < mr; i++) {
                __m256i p = LC_FN(iq_dot32)(v, _mm256_loadu_si256((const __m256i *)(xq + i * k + 256 * ib + 32 * j)));
                __m256 f = _mm256_permutevar8x32_ps(cs[i], _mm256_set1_epi32(j));
                acc[i][j & 1] = _mm256_fmadd_ps(f, _mm256_cvtepi32_ps(p), acc[i][j & 1]);
            }
        }
    }
    for (int i = 0; i < mr; i++) res[i] = LC_FN(hsum)(_mm256_add_ps(acc[i][0], acc[i][1]));
}
#endif

static void LC_FN(iq4xs_rows)(const uint8_t *row, int64_t k, const int8_t *xq, const float *dx, int mr, float *res) {
    switch (mr) { /* a literal: the accumulators stay in registers */
    case 1: LC_FN(iq4xs_brow)(1, row, k, xq, dx, res); break;
    case 2: LC_FN(iq4xs_brow)(2, row, k, xq, dx, res); break;
    case 3: LC_FN(iq4xs_brow)(3, row, k, xq, dx, res); break;
    default: LC_FN(iq4xs_brow)(4, row, k, xq, dx, res); break;
    }
}

#if LC_ISA == LC_ISA_AVX512VNNI
/* IQ3_XXS / IQ3_S rows on AVX-512, two sub-blocks (64 values) per 512-bit step: one gather of their 16
   4-byte grid rows, the activations' signs flipped under a 64-bit mask, one vpdpbusd, one float FMA. The 8
   sub-block scales and sign words of a block come from vector code once per block (IQ3_XXS's sign indices
   gain their parity bit in registers). Same scale expressions as lc_iq_dec, so the same bits. */
static inline __attribute__((always_inline)) void LC_FN(iq3_brow)(const int type, const int mr, const uint8_t *row,
                                                                   int64_t k, const int8_t *xq, const float *xd,
                                                                   float *res) {
    const int xxs = type == LC_IQ3_XXS;
    const int64_t bytes = xxs ? 98 : 110;
    __m512 acc[4][2]; /* two chains per row: even and odd sub-block pairs */
    for (int i = 0; i < 4; i++) acc[i][0] = acc[i][1] = _mm512_setzero_ps();
    const __m512i pick0 = _mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1);
    for (int64_t ib = 0; ib < k / 256; ib++) {
        const uint8_t *b = row + bytes * ib;
        const __m256 d = _mm256_set1_ps(_cvtsh_ss(lc_u16(b)));
        uint32_t signs[8];
        __m256 sc;
        if (xxs) { /* 8 words: four 7-bit sign indices and the 4-bit scale each */
            __m256i aux = _mm256_loadu_si256((const __m256i *)(b + 66));
            sc = _mm256_mul_ps(_mm256_mul_ps(d, _mm256_add_ps(_mm256_set1_ps(0.5f), _mm256_cvtepi32_ps(_mm256_srli_epi32(aux, 28)))),
                               _mm256_set1_ps(0.5f));
            LC_FN(iq3xxs_signs)(aux, signs);
        } else {
            __m256i q = _mm256_srlv_epi32(_mm256_set1_epi32((int)lc_u32(b + 106)), _mm256_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28));
            q = _mm256_add_epi32(_mm256_slli_epi32(_mm256_and_si256(q, _mm256_set1_epi32(15)), 1), _mm256_set1_epi32(1));
            sc = _mm256_mul_ps(d, _mm256_cvtepi32_ps(q));
            memcpy(signs, b + 74, 32);
        }
        const __m512 sc2 = _mm512_castps256_ps512(sc);
        for (int j = 0; j < 8; j += 2) {
            __m512i g;
            if (xxs) { /* rows inserted from 8-bit indices: faster than the gather (Zen 4: 1.25 vs 1.37 ms) */
                const uint8_t *qs = b + 2 + 8 * j;
#define LC_G(n) LC_FN(iq_i32)(lc_iq3xxs_grid[qs[n]])
                g = _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_setr_epi32(LC_G(0), LC_G(1), LC_G(2), LC_G(3), LC_G(4),
                                                                                LC_G(5), LC_G(6), LC_G(7))),
                                       _mm256_setr_epi32(LC_G(8), LC_G(9), LC_G(10), LC_G(11), LC_G(12), LC_G(13),
                                                         LC_G(14), LC_G(15)),
                                       1);
#undef LC_G
            } else { /* 9-bit indices: one gather beats computing and inserting 16 (1.44 vs 1.56 ms) */
                __m512i idx = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(b + 2 + 8 * j)));
                __m512i qh = _mm512_srlv_epi32(_mm512_set1_epi32(lc_u16(b + 66 + j)),
                                               _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15));
                qh = _mm512_slli_epi32(_mm512_and_si512(qh, _mm512_set1_epi32(1)), 8); /* bit l of qh: 9th bit of index l */
                g = _mm512_i32gather_epi32(_mm512_or_si512(idx, qh), (const void *)lc_iq3s_grid, 4);
            }
            __mmask64 m = _cvtu64_mask64((uint64_t)signs[j] | ((uint64_t)signs[j + 1] << 32));
            __m512 l = _mm512_permutexvar_ps(_mm512_add_epi32(pick0, _mm512_set1_epi32(j)), sc2);
            for (int i = 0; i < mr; i++) {
                __m512i x = _mm512_loadu_si512((const void *)(xq + i * k + 256 * ib + 32 * j));
                x = _mm512_mask_sub_epi8(x, m, _mm512_setzero_si512(), x);
                __m512i p = _mm512_dpbusd_epi32(_mm512_setzero_si512(), g, x);
                __m512 f = _mm512_mul_ps(l, _mm512_loadu_ps(xd + i * (k / 4) + 64 * ib + 8 * j));
                acc[i][j >> 1 & 1] = _mm512_fmadd_ps(f, _mm512_cvtepi32_ps(p), acc[i][j >> 1 & 1]);
            }
        }
    }
    for (int i = 0; i < mr; i++) res[i] = _mm512_reduce_add_ps(_mm512_add_ps(acc[i][0], acc[i][1]));
}
#endif

#include "lc_lowbit_rows.h" /* lb_brow: NVFP4 / Q1_0 / Q2_0 a block at a time */

#define LC_IQ_ROWS(F, T)                                                                                \
    switch (mr) {                                                                                       \
    case 1: LC_FN(F)(T, 1, row, k, xq, xd, res); break;                                                 \
    case 2: LC_FN(F)(T, 2, row, k, xq, xd, res); break;                                                 \
    case 3: LC_FN(F)(T, 3, row, k, xq, xd, res); break;                                                 \
    default: LC_FN(F)(T, 4, row, k, xq, xd, res); break;                                                \
    }

static void LC_FN(iq_rows)(int type, const uint8_t *row, int64_t k, const int8_t *xq, const float *xd, int mr,
                           float *res) {
    switch (type) { /* every type a literal: its decode inlines into the loop */
    case LC_IQ4_NL: LC_IQ_ROWS(iq_row, LC_IQ4_NL) break;
    case LC_IQ4_XS: LC_IQ_ROWS(iq_row, LC_IQ4_XS) break; /* without dx32: iq_matmul runs iq4xs_rows */
    case LC_MXFP4: LC_IQ_ROWS(iq_row, LC_MXFP4) break;
    case LC_NVFP4: LC_IQ_ROWS(lb_brow, LC_NVFP4) break;
    case LC_Q1_0: LC_IQ_ROWS(lb_brow, LC_Q1_0) break;
    case LC_Q2_0: LC_IQ_ROWS(lb_brow, LC_Q2_0) break;
    case LC_IQ2_XXS: LC_IQ_ROWS(iq_brow, LC_IQ2_XXS) break;
    case LC_IQ2_XS: LC_IQ_ROWS(iq_brow, LC_IQ2_XS) break;
    case LC_IQ2_S: LC_IQ_ROWS(iq_brow, LC_IQ2_S) break;
#if LC_ISA == LC_ISA_AVX512VNNI && !defined(LC_IQ3_NO512)
    case LC_IQ3_XXS: LC_IQ_ROWS(iq3_brow, LC_IQ3_XXS) break;
    case LC_IQ3_S: LC_IQ_ROWS(iq3_brow, LC_IQ3_S) break;
#else
    case LC_IQ3_XXS: LC_IQ_ROWS(iq_brow, LC_IQ3_XXS) break;
    case LC_IQ3_S: LC_IQ_ROWS(iq_brow, LC_IQ3_S) break;
#endif
    case LC_IQ1_S: LC_IQ_ROWS(iq_brow, LC_IQ1_S) break;
    case LC_IQ1_M: LC_IQ_ROWS(iq_brow, LC_IQ1_M) break;
    case LC_TQ1_0: LC_IQ_ROWS(iq_brow, LC_TQ1_0) break;
    default: LC_IQ_ROWS(iq_brow, LC_TQ2_0) break;
    }
}
#undef LC_IQ_ROWS
#elif defined(__aarch64__) && defined(__ARM_NEON) /* lc_iq_neon.h: decode in registers, NEON dot products */
#include "lc_iq_neon.h"
#else
static void LC_FN(iq_rows)(int type, const uint8_t *row, int64_t k, const int8_t *xq, const float *xd, int mr,
                           float *res) {
    int8_t v[32];
    float ls[8];
    for (int i = 0; i < mr; i++) res[i] = 0.0f;
    for (int64_t s = 0; s < k / 32; s++) {
        lc_iq_dec_row(type, row, s, v, ls);
        for (int i = 0; i < mr; i++) {
            const int8_t *x = xq + i * k + 32 * s;
            const float *dx = xd + i * (k / 4) + 8 * s;
            float acc = 0.0f;
            for (int l = 0; l < 8; l++) {
                int32_t sum = 0;
                for (int m = 0; m < 4; m++) sum += (int32_t)v[4 * l + m] * (int32_t)x[4 * l + m];
                acc += ls[l] * dx[l] * (float)sum;
            }
            res[i] += acc;
        }
    }
}
#endif

/* out[i, j] (row stride ldo) = activation row i (lc_quantize's xq/xd, t rows) . weight row j (n rows of
   i-quant blocks, row_bytes apart). Activation rows go in chunks of LC_IQ_CHUNK (their codes stay in L2
   while every weight row passes), weight rows split over threads, and each weight row is decoded once
   per 4 activation rows (its ~k/2 bytes stay in L1 across them). dx32: the activations' per-32 scales
   [t, k / 32] (lc_x16_summaries) or NULL; x86 runs IQ4_XS with them (iq4xs_rows). */
#ifndef LC_IQ_CHUNK
#define LC_IQ_CHUNK 64
#endif
static void LC_FN(iq_matmul)(int type, const uint8_t *w, int64_t n, int64_t k, int64_t row_bytes, const int8_t *xq,
                             const float *xd, const float *dx32, int64_t t, void *out, int out_bf16, int64_t ldo,
                             int nth) {
    for (int64_t c0 = 0; c0 < t; c0 += LC_IQ_CHUNK) {
        int64_t c1 = c0 + LC_IQ_CHUNK < t ? c0 + LC_IQ_CHUNK : t;
#ifdef _OPENMP
#pragma omp parallel for num_threads(nth) schedule(static) if (n * k * (c1 - c0) >= 262144)
#endif
        for (int64_t r = 0; r < n; r++) {
            const uint8_t *row = w + r * row_bytes;
            for (int64_t t0 = c0; t0 < c1; t0 += 4) {
                int mr = (int)(c1 - t0 < 4 ? c1 - t0 : 4);
                float res[4];
#if LC_ISA == LC_ISA_AVX2 || LC_ISA == LC_ISA_AVX512VNNI
                if (type == LC_IQ4_XS && dx32) LC_FN(iq4xs_rows)(row, k, xq + t0 * k, dx32 + t0 * (k / 32), mr, res);
                else
#endif
                    LC_FN(iq_rows)(type, row, k, xq + t0 * k, xd + t0 * (k / 4), mr, res);
                for (int i = 0; i < mr; i++) lc_store(out, out_bf16, (t0 + i) * ldo + r, res[i]);
            }
        }
    }
}
