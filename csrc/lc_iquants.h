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
AVX-512 VNNI decode IQ4_NL/IQ4_XS/MXFP4 (the 16-entry nonlinear table through vpshufb) and the IQ2/IQ3 grid
types (grid rows gathered, sign bits spread to byte masks) in registers, and take IQ1 and the ternary types
from the scalar decoder into a 32-value buffer, with vector dot products for all. Steps of many rows run
lc_iq_gemm.h instead, which decodes through the same functions. */

#ifndef LC_IQ_COMMON
#define LC_IQ_COMMON
#include "lc_iq_grids.h"

static inline int lc_is_iq(int type) {
    return (type >= LC_IQ2_XXS && type <= LC_IQ4_XS) || type == LC_IQ1_M || type == LC_TQ1_0 || type == LC_TQ2_0 ||
           type == LC_MXFP4;
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
    else lc_iq_dec(type, row + lc_block_bytes(type) * (s / 8), (int)(s % 8), v, ls);
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

/* 8-byte grid rows g0..g3 (values 0-7, 8-15, ...) with sign byte l of `signs` (bit j: value 8l + j negative)
   applied: the sign bits spread to byte masks m, then (g ^ m) - m. */
static inline __m256i LC_FN(iq_grid8)(const int8_t *g0, const int8_t *g1, const int8_t *g2, const int8_t *g3,
                                      uint32_t signs) {
    int64_t r[4];
    memcpy(r, g0, 8);
    memcpy(r + 1, g1, 8);
    memcpy(r + 2, g2, 8);
    memcpy(r + 3, g3, 8);
    __m256i g = _mm256_setr_epi64x(r[0], r[1], r[2], r[3]);
    const __m256i spread = _mm256_setr_epi64x(0, 0x0101010101010101LL, 0x0202020202020202LL, 0x0303030303030303LL);
    const __m256i bits = _mm256_set1_epi64x((int64_t)0x8040201008040201ULL);
    __m256i m = _mm256_shuffle_epi8(_mm256_set1_epi32((int)signs), spread);
    m = _mm256_cmpeq_epi8(_mm256_and_si256(m, bits), bits);
    return _mm256_sub_epi8(_mm256_xor_si256(g, m), m);
}

/* As iq_grid8 from eight 4-byte grid rows (IQ3 types): rows idx[0..7] of `grid`. */
static inline __m256i LC_FN(iq_grid4)(const int8_t (*grid)[4], const int *idx, uint32_t signs) {
    int32_t r[8];
    for (int j = 0; j < 8; j++) memcpy(r + j, grid[idx[j]], 4);
    int8_t rows[32];
    memcpy(rows, r, 32);
    return LC_FN(iq_grid8)(rows, rows + 8, rows + 16, rows + 24, signs);
}

/* Sub-block s of a row in registers: 32 signed values and the scale of each 4-value lane. IQ4 types decode
   in registers (F16C for the scale), the IQ2/IQ3 grid types gather grid rows and flip signs in registers
   (a scalar loop per value was most of their matmul time); the rest go through lc_iq_dec. The scales keep
   lc_iq_dec's float32 expressions, so both decoders give the same bits. */
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
    } else if (type == LC_IQ4_XS) {
        const uint8_t *b = row + 136 * (s / 8);
        int i = (int)(s % 8);
        int q = ((b[4 + i / 2] >> (4 * (i % 2))) & 15) | (((lc_u16(b + 2) >> (2 * i)) & 3) << 4);
        *v = LC_FN(iq4_values)(b + 8 + 16 * i, lc_iq4nl_values);
        *lsv = _mm256_set1_ps(_cvtsh_ss(lc_u16(b)) * (float)(q - 32));
    } else if (type == LC_IQ2_XXS) {
        const uint8_t *b = row + 66 * (s / 8), *q = b + 2 + 8 * (s % 8);
        uint32_t aux = lc_u32(q + 4);
        *v = LC_FN(iq_grid8)(lc_iq2xxs_grid[q[0]], lc_iq2xxs_grid[q[1]], lc_iq2xxs_grid[q[2]], lc_iq2xxs_grid[q[3]],
                             lc_iq_ksigns4(aux));
        *lsv = _mm256_set1_ps(lc_f16(lc_u16(b)) * (0.5f + (float)(aux >> 28)) * 0.25f);
    } else if (type == LC_IQ2_XS) {
        const uint8_t *b = row + 74 * (s / 8);
        int i = (int)(s % 8);
        uint16_t q[4];
        memcpy(q, b + 2 + 8 * i, 8);
        uint32_t signs = (uint32_t)lc_iq_ksigns[q[0] >> 9] | ((uint32_t)lc_iq_ksigns[q[1] >> 9] << 8) |
                         ((uint32_t)lc_iq_ksigns[q[2] >> 9] << 16) | ((uint32_t)lc_iq_ksigns[q[3] >> 9] << 24);
        *v = LC_FN(iq_grid8)(lc_iq2xs_grid[q[0] & 511], lc_iq2xs_grid[q[1] & 511], lc_iq2xs_grid[q[2] & 511],
                             lc_iq2xs_grid[q[3] & 511], signs);
        float d = lc_f16(lc_u16(b));
        uint8_t scales = b[66 + i];
        float s0 = d * (0.5f + (float)(scales & 15)) * 0.25f, s1 = d * (0.5f + (float)(scales >> 4)) * 0.25f;
        *lsv = _mm256_setr_ps(s0, s0, s0, s0, s1, s1, s1, s1);
    } else if (type == LC_IQ2_S) {
        const uint8_t *b = row + 82 * (s / 8);
        int i = (int)(s % 8);
        uint8_t qh = b[66 + i], scales = b[74 + i];
        const uint8_t *qs = b + 2 + 4 * i;
        *v = LC_FN(iq_grid8)(lc_iq2s_grid[qs[0] | ((qh & 3) << 8)], lc_iq2s_grid[qs[1] | (((qh >> 2) & 3) << 8)],
                             lc_iq2s_grid[qs[2] | (((qh >> 4) & 3) << 8)], lc_iq2s_grid[qs[3] | (((qh >> 6) & 3) << 8)],
                             lc_u32(b + 34 + 4 * i));
        float d = lc_f16(lc_u16(b));
        float s0 = d * (0.5f + (float)(scales & 15)) * 0.25f, s1 = d * (0.5f + (float)(scales >> 4)) * 0.25f;
        *lsv = _mm256_setr_ps(s0, s0, s0, s0, s1, s1, s1, s1);
    } else if (type == LC_IQ3_XXS) {
        const uint8_t *b = row + 98 * (s / 8), *qs = b + 2 + 8 * (s % 8);
        uint32_t aux = lc_u32(b + 66 + 4 * (s % 8));
        int idx[8];
        for (int j = 0; j < 8; j++) idx[j] = qs[j];
        *v = LC_FN(iq_grid4)(lc_iq3xxs_grid, idx, lc_iq_ksigns4(aux));
        *lsv = _mm256_set1_ps(lc_f16(lc_u16(b)) * (0.5f + (float)(aux >> 28)) * 0.5f);
    } else if (type == LC_IQ3_S) {
        const uint8_t *b = row + 110 * (s / 8), *qs = b + 2 + 8 * (s % 8);
        int i = (int)(s % 8);
        uint8_t qh = b[66 + i];
        int idx[8];
        for (int j = 0; j < 8; j++) idx[j] = qs[j] | (((qh >> j) & 1) << 8);
        *v = LC_FN(iq_grid4)(lc_iq3s_grid, idx, lc_u32(b + 74 + 4 * i));
        *lsv = _mm256_set1_ps(lc_f16(lc_u16(b)) * (float)(1 + 2 * ((b[106 + i / 2] >> (4 * (i % 2))) & 15)));
    } else {
        int8_t vb[32];
        float ls[8];
        lc_iq_dec_row(type, row, s, vb, ls);
        *v = _mm256_loadu_si256((const __m256i *)vb);
        *lsv = _mm256_loadu_ps(ls);
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

#define LC_IQ_ROWS(T)                                                                                   \
    switch (mr) {                                                                                       \
    case 1: LC_FN(iq_row)(T, 1, row, k, xq, xd, res); break;                                            \
    case 2: LC_FN(iq_row)(T, 2, row, k, xq, xd, res); break;                                            \
    case 3: LC_FN(iq_row)(T, 3, row, k, xq, xd, res); break;                                            \
    default: LC_FN(iq_row)(T, 4, row, k, xq, xd, res); break;                                           \
    }

static void LC_FN(iq_rows)(int type, const uint8_t *row, int64_t k, const int8_t *xq, const float *xd, int mr,
                           float *res) {
    switch (type) { /* the IQ4 types as literals: their decode inlines into the loop */
    case LC_IQ4_NL: LC_IQ_ROWS(LC_IQ4_NL) break;
    case LC_IQ4_XS: LC_IQ_ROWS(LC_IQ4_XS) break;
    case LC_MXFP4: LC_IQ_ROWS(LC_MXFP4) break;
    default: LC_IQ_ROWS(type) break;
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
   per 4 activation rows (its ~k/2 bytes stay in L1 across them). */
#ifndef LC_IQ_CHUNK
#define LC_IQ_CHUNK 64
#endif
static void LC_FN(iq_matmul)(int type, const uint8_t *w, int64_t n, int64_t k, int64_t row_bytes, const int8_t *xq,
                             const float *xd, int64_t t, void *out, int out_bf16, int64_t ldo, int nth) {
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
                LC_FN(iq_rows)(type, row, k, xq + t0 * k, xd + t0 * (k / 4), mr, res);
                for (int i = 0; i < mr; i++) lc_store(out, out_bf16, (t0 + i) * ldo + r, res[i]);
            }
        }
    }
}
