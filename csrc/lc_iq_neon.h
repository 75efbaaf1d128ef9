/* The i-quants, ternary types and MXFP4 (lc_iquants.h) on ARM NEON: each 32-value sub-block decoded in two
int8x16 registers, dotted with the 8-bit activations in int32 lanes, and the few-row GEMM's panel tile
(lc_iq_gemm.h).

Decode: IQ4_NL / IQ4_XS / MXFP4 look their nibbles up in the type's 16 values with one tbl per 16; the
IQ2 types load four 8-byte grid rows and the IQ3 types eight 4-byte ones, and the sign bytes (lc_iq_ksigns
or stored) spread to byte masks (tbl, then test against 1, 2, 4 .. 128) flip them as (g ^ m) - m; IQ1_S
/ IQ1_M are 8 * grid +- 1; TQ2_0 shifts and masks its 2-bit codes, TQ1_0 takes base-3 digits by a
wrapping byte multiply and the high byte of 3 q. Every value is the int8 lc_iq_dec gives and every
scale the same float32 expression, so codes and scales are the same bits as the portable decoder's
(which match gguf.quants); only the float summation order of the dot products differs from it.

Dot products: with the Armv8.2 dot product (the NEON ISA's functions, compiled for it by lc_kernels.c,
or any build whose target has it, e.g. Apple silicon) one sdot adds 16 byte products into 4 int32
lanes; without it (the portable variant of an armv8-a build) smull / smull2 make int16 products and
pairwise adds (saddlp, addp; sadalp in the tile) take them to int32 lanes (|code|, |activation| <= 127:
no overflow).

Included by lc_iquants.h in place of its plain C loops when the target has NEON, once per ISA variant
(LC_FN); it defines LC_FN(iq_rows) (the one-row / few-row kernel lc_iquants.h's iq_matmul calls),
LC_FN(iqn_dec) (lc_iq_gemm.h's panel decode) and LC_FN(iqg_tile) (lc_iq_gemm.h's tile). */

#include <arm_neon.h> /* (lc_kernels.c includes it only where it builds the NEON ISA) */

#if LC_ISA == LC_ISA_NEON || defined(__ARM_FEATURE_DOTPROD)
#define LC_IQN_SDOT 1
#else
#define LC_IQN_SDOT 0
#endif

#ifndef LC_IQN_COMMON
#define LC_IQN_COMMON
/* Byte j of the sign masks: bit j % 8 of sign byte j / 8 (lo: bytes 0, 1; hi: bytes 2, 3 of the word). */
static const uint8_t lc_iqn_spread[2][16] = {{0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1},
                                             {2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3}};
static const uint8_t lc_iqn_bits[16] = {1, 2, 4, 8, 16, 32, 64, 128, 1, 2, 4, 8, 16, 32, 64, 128};
/* TQ1_0's last 16 values of sub-block 7: bytes 48..51, digit (j - 16) / 4 of byte 48 + (j - 16) % 4. */
static const uint8_t lc_iqn_tq1_pow[16] = {1, 1, 1, 1, 3, 3, 3, 3, 9, 9, 9, 9, 27, 27, 27, 27};

/* The types whose scale changes every 16 values (two per sub-block). */
static inline int lc_iqn_per16(int type) {
    return type == LC_IQ2_XS || type == LC_IQ2_S || type == LC_IQ1_M || type == LC_NVFP4;
}
#endif /* LC_IQN_COMMON */

/* acc + the 16 products v[j] x[j]: lane l adds products 4l .. 4l + 3. The smull form keeps sdot's lanes
   (two more instructions than smlal2 + sadalp would take), so both give the same float results. */
static inline int32x4_t LC_FN(iqn_dot16)(int32x4_t acc, int8x16_t v, int8x16_t x) {
#if LC_IQN_SDOT
    return vdotq_s32(acc, v, x);
#else
    int16x8_t lo = vmull_s8(vget_low_s8(v), vget_low_s8(x)), hi = vmull_high_s8(v, x);
    return vaddq_s32(acc, vpaddq_s32(vpaddlq_s16(lo), vpaddlq_s16(hi)));
#endif
}

/* Whether this variant's dot products are sdot (for tests/c/iq_neon_check.c). */
static inline int LC_FN(iqn_sdot)(void) { return LC_IQN_SDOT; }

/* f16 bits as float32 (fcvt: exact, as lc_f16, without its libm call for subnormals). */
static inline float LC_FN(iqn_h)(uint16_t h) {
    return vgetq_lane_f32(vcvt_f32_f16(vreinterpret_f16_u16(vdup_n_u16(h))), 0);
}
static inline float LC_FN(iqn_f16)(const uint8_t *p) { return LC_FN(iqn_h)(lc_u16(p)); }

/* *v0 (values 0-15), *v1 (16-31) = a and b with value j negated where bit j % 8 of sign byte j / 8 of
   `signs` is set: the bits spread to 0 / -1 byte masks m, then (g ^ m) - m. */
static inline void LC_FN(iqn_sign)(int8x16_t a, int8x16_t b, uint32_t signs, int8x16_t *v0, int8x16_t *v1) {
    const uint8x16_t bits = vld1q_u8(lc_iqn_bits);
    uint8x16_t s = vreinterpretq_u8_u32(vdupq_n_u32(signs));
    int8x16_t m0 = vreinterpretq_s8_u8(vtstq_u8(vqtbl1q_u8(s, vld1q_u8(lc_iqn_spread[0])), bits));
    int8x16_t m1 = vreinterpretq_s8_u8(vtstq_u8(vqtbl1q_u8(s, vld1q_u8(lc_iqn_spread[1])), bits));
    *v0 = vsubq_s8(veorq_s8(a, m0), m0);
    *v1 = vsubq_s8(veorq_s8(b, m1), m1);
}

/* IQ4_NL / IQ4_XS / MXFP4: 16 bytes of nibbles (value j low in byte j, value j + 16 high) through `values`. */
static inline void LC_FN(iqn_iq4)(const uint8_t *qs, const int8_t *values, int8x16_t *v0, int8x16_t *v1) {
    const int8x16_t table = vld1q_s8(values);
    uint8x16_t q = vld1q_u8(qs);
    *v0 = vqtbl1q_s8(table, vandq_u8(q, vdupq_n_u8(15)));
    *v1 = vqtbl1q_s8(table, vshrq_n_u8(q, 4));
}

/* Four 8-byte grid rows, signed by `signs` (IQ2 types). */
static inline void LC_FN(iqn_grid8)(const int8_t *g0, const int8_t *g1, const int8_t *g2, const int8_t *g3,
                                    uint32_t signs, int8x16_t *v0, int8x16_t *v1) {
    LC_FN(iqn_sign)(vcombine_s8(vld1_s8(g0), vld1_s8(g1)), vcombine_s8(vld1_s8(g2), vld1_s8(g3)), signs, v0, v1);
}

/* Eight 4-byte grid rows idx[0..7] of `grid`, signed by `signs` (IQ3 types). */
static inline void LC_FN(iqn_grid4)(const int8_t (*grid)[4], const int *idx, uint32_t signs, int8x16_t *v0,
                                    int8x16_t *v1) {
    uint64_t r[4]; /* rows paired in general registers: through memory, four 4-byte stores would not forward
                      to the 16-byte loads */
    for (int j = 0; j < 4; j++) {
        uint32_t a, b;
        memcpy(&a, grid[idx[2 * j]], 4);
        memcpy(&b, grid[idx[2 * j + 1]], 4);
        r[j] = a | (uint64_t)b << 32;
    }
    LC_FN(iqn_sign)(vreinterpretq_s8_u64(vcombine_u64(vcreate_u64(r[0]), vcreate_u64(r[1]))),
                    vreinterpretq_s8_u64(vcombine_u64(vcreate_u64(r[2]), vcreate_u64(r[3]))), signs, v0, v1);
}

/* IQ1 types: four 8-byte rows of lc_iq1s_grid (-1, 0, 1) as 8 g + shift (shift l: -1 or +1 for row l). */
static inline void LC_FN(iqn_iq1)(const int *idx, const int *shift, int8x16_t *v0, int8x16_t *v1) {
    int8x16_t a = vcombine_s8(vld1_s8(lc_iq1s_grid[idx[0]]), vld1_s8(lc_iq1s_grid[idx[1]]));
    int8x16_t b = vcombine_s8(vld1_s8(lc_iq1s_grid[idx[2]]), vld1_s8(lc_iq1s_grid[idx[3]]));
    int8x16_t s0 = vcombine_s8(vdup_n_s8((int8_t)shift[0]), vdup_n_s8((int8_t)shift[1]));
    int8x16_t s1 = vcombine_s8(vdup_n_s8((int8_t)shift[2]), vdup_n_s8((int8_t)shift[3]));
    *v0 = vaddq_s8(vshlq_n_s8(a, 3), s0);
    *v1 = vaddq_s8(vshlq_n_s8(b, 3), s1);
}

/* TQ1_0: base-3 digit of each byte q (times 3^n, wrapping: the digit moves to the byte's top) as ((3 q) >> 8) - 1. */
static inline int8x16_t LC_FN(iqn_trit)(uint8x16_t q, uint8x16_t pow) {
    q = vmulq_u8(q, pow);
    uint16x8_t lo = vmull_u8(vget_low_u8(q), vdup_n_u8(3)), hi = vmull_high_u8(q, vdupq_n_u8(3));
    return vsubq_s8(vreinterpretq_s8_u8(vshrn_high_n_u16(vshrn_n_u16(lo, 8), hi, 8)), vdupq_n_s8(1));
}

/* Sub-block i (0..7; 0 for IQ4_NL and MXFP4, whose blocks are one) of the block at b in registers: values
   0-15 in *v0, 16-31 in *v1, d[0] and d[1] the scales of the two halves (equal but for IQ2_XS / IQ2_S /
   IQ1_M), each lc_iq_dec's float32 expression. */
static inline __attribute__((always_inline)) void LC_FN(iqn_sub)(const int type, const uint8_t *b, const int i,
                                                                  int8x16_t *v0, int8x16_t *v1, float *d) {
    if (type == LC_IQ4_NL) {
        LC_FN(iqn_iq4)(b + 2, lc_iq4nl_values, v0, v1);
        d[0] = d[1] = LC_FN(iqn_f16)(b);
    } else if (lc_is_lowbit(type)) {
        LC_FN(lbn_sub)(type, b, i, v0, v1, d); /* lc_lowbit.h */
    } else if (type == LC_MXFP4) {
        LC_FN(iqn_iq4)(b + 1, lc_mxfp4_values, v0, v1);
        d[0] = d[1] = lc_e8m0_half(b[0]);
    } else if (type == LC_IQ4_XS) {
        int q = ((b[4 + i / 2] >> (4 * (i % 2))) & 15) | (((lc_u16(b + 2) >> (2 * i)) & 3) << 4);
        LC_FN(iqn_iq4)(b + 8 + 16 * i, lc_iq4nl_values, v0, v1);
        d[0] = d[1] = LC_FN(iqn_f16)(b) * (float)(q - 32);
    } else if (type == LC_IQ2_XXS) {
        const uint8_t *q = b + 2 + 8 * i;
        uint32_t aux = lc_u32(q + 4);
        LC_FN(iqn_grid8)(lc_iq2xxs_grid[q[0]], lc_iq2xxs_grid[q[1]], lc_iq2xxs_grid[q[2]], lc_iq2xxs_grid[q[3]],
                         lc_iq_ksigns4(aux), v0, v1);
        d[0] = d[1] = LC_FN(iqn_f16)(b) * (0.5f + (float)(aux >> 28)) * 0.25f;
    } else if (type == LC_IQ2_XS) {
        uint16_t q[4];
        memcpy(q, b + 2 + 8 * i, 8);
        uint32_t signs = (uint32_t)lc_iq_ksigns[q[0] >> 9] | ((uint32_t)lc_iq_ksigns[q[1] >> 9] << 8) |
                         ((uint32_t)lc_iq_ksigns[q[2] >> 9] << 16) | ((uint32_t)lc_iq_ksigns[q[3] >> 9] << 24);
        LC_FN(iqn_grid8)(lc_iq2xs_grid[q[0] & 511], lc_iq2xs_grid[q[1] & 511], lc_iq2xs_grid[q[2] & 511],
                         lc_iq2xs_grid[q[3] & 511], signs, v0, v1);
        float f = LC_FN(iqn_f16)(b);
        uint8_t scales = b[66 + i];
        d[0] = f * (0.5f + (float)(scales & 15)) * 0.25f;
        d[1] = f * (0.5f + (float)(scales >> 4)) * 0.25f;
    } else if (type == LC_IQ2_S) {
        const uint8_t *qs = b + 2 + 4 * i;
        uint8_t qh = b[66 + i], scales = b[74 + i];
        LC_FN(iqn_grid8)(lc_iq2s_grid[qs[0] | ((qh & 3) << 8)], lc_iq2s_grid[qs[1] | (((qh >> 2) & 3) << 8)],
                         lc_iq2s_grid[qs[2] | (((qh >> 4) & 3) << 8)], lc_iq2s_grid[qs[3] | (((qh >> 6) & 3) << 8)],
                         lc_u32(b + 34 + 4 * i), v0, v1);
        float f = LC_FN(iqn_f16)(b);
        d[0] = f * (0.5f + (float)(scales & 15)) * 0.25f;
        d[1] = f * (0.5f + (float)(scales >> 4)) * 0.25f;
    } else if (type == LC_IQ3_XXS) {
        const uint8_t *qs = b + 2 + 8 * i;
        uint32_t aux = lc_u32(b + 66 + 4 * i);
        int idx[8];
        for (int j = 0; j < 8; j++) idx[j] = qs[j];
        LC_FN(iqn_grid4)(lc_iq3xxs_grid, idx, lc_iq_ksigns4(aux), v0, v1);
        d[0] = d[1] = LC_FN(iqn_f16)(b) * (0.5f + (float)(aux >> 28)) * 0.5f;
    } else if (type == LC_IQ3_S) {
        const uint8_t *qs = b + 2 + 8 * i;
        uint8_t qh = b[66 + i];
        int idx[8];
        for (int j = 0; j < 8; j++) idx[j] = qs[j] | (((qh >> j) & 1) << 8);
        LC_FN(iqn_grid4)(lc_iq3s_grid, idx, lc_u32(b + 74 + 4 * i), v0, v1);
        d[0] = d[1] = LC_FN(iqn_f16)(b) * (float)(1 + 2 * ((b[106 + i / 2] >> (4 * (i % 2))) & 15));
    } else if (type == LC_IQ1_S) {
        uint16_t qh = lc_u16(b + 34 + 2 * i);
        int idx[4], shift[4];
        for (int l = 0; l < 4; l++) {
            idx[l] = b[2 + 4 * i + l] | (((qh >> (3 * l)) & 7) << 8);
            shift[l] = qh & 0x8000 ? -1 : 1;
        }
        LC_FN(iqn_iq1)(idx, shift, v0, v1);
        d[0] = d[1] = LC_FN(iqn_f16)(b) * (float)(2 * ((qh >> 12) & 7) + 1) * 0.125f;
    } else if (type == LC_IQ1_M) {
        uint16_t s0 = lc_u16(b + 48), s1 = lc_u16(b + 50), s2 = lc_u16(b + 52), s3 = lc_u16(b + 54);
        float f = LC_FN(iqn_h)((uint16_t)((s0 >> 12) | ((s1 >> 8) & 0xF0) | ((s2 >> 4) & 0xF00) | (s3 & 0xF000)));
        int idx[4], shift[4];
        for (int l = 0; l < 4; l++) {
            int nib = (b[32 + 2 * i + l / 2] >> (4 * (l % 2))) & 15;
            idx[l] = b[4 * i + l] | ((nib & 7) << 8);
            shift[l] = nib & 8 ? -1 : 1;
        }
        LC_FN(iqn_iq1)(idx, shift, v0, v1);
        for (int h = 0; h < 2; h++) {
            int j = 2 * i + h; /* the 3-bit scale of each 16 values, four per 16-bit word */
            d[h] = f * (float)(2 * ((lc_u16(b + 48 + 2 * (j / 4)) >> (3 * (j % 4))) & 7) + 1) * 0.125f;
        }
    } else if (type == LC_TQ2_0) {
        const uint8_t *qs = b + 32 * (i / 4);
        const int8x16_t shift = vdupq_n_s8((int8_t)(-2 * (i % 4))), one = vdupq_n_s8(1);
        const uint8x16_t three = vdupq_n_u8(3);
        *v0 = vsubq_s8(vreinterpretq_s8_u8(vandq_u8(vshlq_u8(vld1q_u8(qs), shift), three)), one);
        *v1 = vsubq_s8(vreinterpretq_s8_u8(vandq_u8(vshlq_u8(vld1q_u8(qs + 16), shift), three)), one);
        d[0] = d[1] = LC_FN(iqn_f16)(b + 64);
    } else { /* LC_TQ1_0: values 0-159 digits 0-4 of bytes 0-31, 160-239 digits 0-4 of bytes 32-47, the rest
                digits 0-3 of bytes 48-51 (lc_iq_dec's index arithmetic, 16 values at a time) */
        static const uint8_t pow3[5] = {1, 3, 9, 27, 81};
        if (i < 5) {
            uint8x16_t p = vdupq_n_u8(pow3[i]);
            *v0 = LC_FN(iqn_trit)(vld1q_u8(b), p);
            *v1 = LC_FN(iqn_trit)(vld1q_u8(b + 16), p);
        } else if (i < 7) {
            uint8x16_t q = vld1q_u8(b + 32);
            *v0 = LC_FN(iqn_trit)(q, vdupq_n_u8(pow3[2 * (i - 5)]));
            *v1 = LC_FN(iqn_trit)(q, vdupq_n_u8(pow3[2 * (i - 5) + 1]));
        } else {
            *v0 = LC_FN(iqn_trit)(vld1q_u8(b + 32), vdupq_n_u8(81));
            *v1 = LC_FN(iqn_trit)(vreinterpretq_u8_u32(vdupq_n_u32(lc_u32(b + 48))), vld1q_u8(lc_iqn_tq1_pow));
        }
        d[0] = d[1] = LC_FN(iqn_f16)(b + 52);
    }
}

/* lc_iq_dec_row's output (v[32], ls[8]) from the decoder above: lc_iq_gemm.h's panel fill, and the test
   harness's bit-for-bit check (tests/c/iq_neon_check.c). */
static void LC_FN(iqn_dec)(int type, const uint8_t *row, int64_t s, int8_t *v, float *ls) {
    int8x16_t v0, v1;
    float d[2];
#define LC_IQN_SUB(T) /* T a literal: the block geometry folds */                                          \
    LC_FN(iqn_sub)(T, row + lc_block_bytes(T) * (s / lc_block_subs(T)), (int)(s % lc_block_subs(T)), &v0, &v1, d)
    switch (type) { /* literals: each decode inlined on its own */
    case LC_IQ4_NL: LC_IQN_SUB(LC_IQ4_NL); break;
    case LC_IQ4_XS: LC_IQN_SUB(LC_IQ4_XS); break;
    case LC_MXFP4: LC_IQN_SUB(LC_MXFP4); break;
    case LC_NVFP4: LC_IQN_SUB(LC_NVFP4); break;
    case LC_Q1_0: LC_IQN_SUB(LC_Q1_0); break;
    case LC_Q2_0: LC_IQN_SUB(LC_Q2_0); break;
    case LC_IQ2_XXS: LC_IQN_SUB(LC_IQ2_XXS); break;
    case LC_IQ2_XS: LC_IQN_SUB(LC_IQ2_XS); break;
    case LC_IQ2_S: LC_IQN_SUB(LC_IQ2_S); break;
    case LC_IQ3_XXS: LC_IQN_SUB(LC_IQ3_XXS); break;
    case LC_IQ3_S: LC_IQN_SUB(LC_IQ3_S); break;
    case LC_IQ1_S: LC_IQN_SUB(LC_IQ1_S); break;
    case LC_IQ1_M: LC_IQN_SUB(LC_IQ1_M); break;
    case LC_TQ1_0: LC_IQN_SUB(LC_TQ1_0); break;
    default: LC_IQN_SUB(LC_TQ2_0); break;
    }
#undef LC_IQN_SUB
    vst1q_s8(v, v0);
    vst1q_s8(v + 16, v1);
    for (int l = 0; l < 8; l++) ls[l] = d[l / 4];
}

/* Sub-block i of the block at b (the row's sub-block s) against activation rows xq/xd [mr] into acc[mr]:
   per row the integer sums (one chain of two dot16 per 32 values, or one dot16 per 16 where the scale
   changes every 16), scaled once in float. */
static inline __attribute__((always_inline)) void LC_FN(iqn_step)(const int type, const int mr, const uint8_t *b,
                                                                   int i, int64_t s, int64_t k, const int8_t *xq,
                                                                   const float *xd, float32x4_t *acc) {
    int8x16_t v0, v1;
    float d[2];
    LC_FN(iqn_sub)(type, b, i, &v0, &v1, d);
    for (int r = 0; r < mr; r++) {
        const int8_t *x = xq + r * k + 32 * s;
        const float dx = xd[r * (k / 4) + 8 * s];
        const int8x16_t x0 = vld1q_s8(x), x1 = vld1q_s8(x + 16);
        if (lc_iqn_per16(type)) {
            int32x4_t p0 = LC_FN(iqn_dot16)(vdupq_n_s32(0), v0, x0), p1 = LC_FN(iqn_dot16)(vdupq_n_s32(0), v1, x1);
            acc[r] = vfmaq_n_f32(acc[r], vcvtq_f32_s32(p0), d[0] * dx);
            acc[r] = vfmaq_n_f32(acc[r], vcvtq_f32_s32(p1), d[1] * dx);
        } else {
            int32x4_t p = LC_FN(iqn_dot16)(LC_FN(iqn_dot16)(vdupq_n_s32(0), v0, x0), v1, x1);
            acc[r] = vfmaq_n_f32(acc[r], vcvtq_f32_s32(p), d[0] * dx);
        }
    }
}

/* Weight row `row` times activation rows xq/xd [mr] (a literal after inlining: the accumulators stay in
   registers): res[i]. Block by block (the sub-block's place in its block a small int, no division per
   sub-block), two sub-blocks per step; even and odd sub-blocks keep separate accumulators, halving the
   chain of dependent float adds a one-row step is bound by. */
static inline __attribute__((always_inline)) void LC_FN(iqn_row)(const int type, const int mr, const uint8_t *row,
                                                                  int64_t k, const int8_t *xq, const float *xd,
                                                                  float *res) {
    float32x4_t acc0[4], acc1[4];
    for (int r = 0; r < mr; r++) acc0[r] = acc1[r] = vdupq_n_f32(0.0f);
    const int64_t subs = k / 32, bytes = lc_block_bytes(type);
    if (type == LC_IQ4_NL || type == LC_MXFP4) { /* one sub-block per block */
        int64_t s = 0;
        for (; s + 2 <= subs; s += 2) {
            LC_FN(iqn_step)(type, mr, row + bytes * s, 0, s, k, xq, xd, acc0);
            LC_FN(iqn_step)(type, mr, row + bytes * (s + 1), 0, s + 1, k, xq, xd, acc1);
        }
        if (s < subs) LC_FN(iqn_step)(type, mr, row + bytes * s, 0, s, k, xq, xd, acc0); /* an odd last one */
    } else {
        const int nsub = (int)lc_block_subs(type); /* 8; NVFP4 / Q2_0 2, Q1_0 4 */
        for (int64_t blk = 0; blk < subs / nsub; blk++) {
            const uint8_t *b = row + bytes * blk;
            for (int i = 0; i < nsub; i += 2) {
                LC_FN(iqn_step)(type, mr, b, i, nsub * blk + i, k, xq, xd, acc0);
                LC_FN(iqn_step)(type, mr, b, i + 1, nsub * blk + i + 1, k, xq, xd, acc1);
            }
        }
    }
    for (int r = 0; r < mr; r++) res[r] = vaddvq_f32(vaddq_f32(acc0[r], acc1[r]));
}

#include "lc_lowbit_rows.h" /* lbn_brow: NVFP4 / Q1_0 / Q2_0 a block at a time */

#define LC_IQN_ROWS_F(F, T)                                                                             \
    switch (mr) {                                                                                       \
    case 1: LC_FN(F)(T, 1, row, k, xq, xd, res); break;                                                 \
    case 2: LC_FN(F)(T, 2, row, k, xq, xd, res); break;                                                 \
    case 3: LC_FN(F)(T, 3, row, k, xq, xd, res); break;                                                 \
    default: LC_FN(F)(T, 4, row, k, xq, xd, res); break;                                                \
    }                                                                                                   \
    break;
#define LC_IQN_ROWS(T) LC_IQN_ROWS_F(iqn_row, T)

/* lc_iquants.h's row kernel: mr (1..4) activation rows against one weight row, every type a literal. */
static void LC_FN(iq_rows)(int type, const uint8_t *row, int64_t k, const int8_t *xq, const float *xd, int mr,
                           float *res) {
    switch (type) {
    case LC_IQ4_NL: LC_IQN_ROWS(LC_IQ4_NL)
    case LC_IQ4_XS: LC_IQN_ROWS(LC_IQ4_XS)
    case LC_MXFP4: LC_IQN_ROWS(LC_MXFP4)
    case LC_NVFP4: LC_IQN_ROWS_F(lbn_brow, LC_NVFP4)
    case LC_Q1_0: LC_IQN_ROWS_F(lbn_brow, LC_Q1_0)
    case LC_Q2_0: LC_IQN_ROWS_F(lbn_brow, LC_Q2_0)
    case LC_IQ2_XXS: LC_IQN_ROWS(LC_IQ2_XXS)
    case LC_IQ2_XS: LC_IQN_ROWS(LC_IQ2_XS)
    case LC_IQ2_S: LC_IQN_ROWS(LC_IQ2_S)
    case LC_IQ3_XXS: LC_IQN_ROWS(LC_IQ3_XXS)
    case LC_IQ3_S: LC_IQN_ROWS(LC_IQ3_S)
    case LC_IQ1_S: LC_IQN_ROWS(LC_IQ1_S)
    case LC_IQ1_M: LC_IQN_ROWS(LC_IQ1_M)
    case LC_TQ1_0: LC_IQN_ROWS(LC_TQ1_0)
    default: LC_IQN_ROWS(LC_TQ2_0)
    }
}
#undef LC_IQN_ROWS
#undef LC_IQN_ROWS_F

#if !LC_IQN_SDOT
/* One activation row x (xd: its lane scales) against the panel, without sdot: per 4-value group smull /
   smull2 of the 16 rows' codes by the 4 activation bytes broadcast, sadalp into two accumulators per 4
   rows (rows 4q, 4q + 1 in c; 4q + 2, 4q + 3 in c2; two lanes each), addp joining them per unit. One row
   at a time keeps the 8 accumulators in registers (the panel is re-read from L1 per row). */
static inline __attribute__((always_inline)) void LC_FN(iqn_tile_row)(const int u, const uint8_t *codes,
                                                                       const float *scales, int64_t k,
                                                                       const int8_t *x, const float *xd, float *v) {
    float32x4_t acc[4];
    for (int q = 0; q < 4; q++) acc[q] = vdupq_n_f32(0.0f);
    for (int64_t h = 0; h < k / u; h++) {
        int32x4_t c[4], c2[4];
        for (int q = 0; q < 4; q++) c[q] = c2[q] = vdupq_n_s32(0);
        for (int g = 0; g < u / 4; g++) {
            const int8_t *p = (const int8_t *)codes + (h * (u / 4) + g) * 64;
            const int8x16_t xb = vreinterpretq_s8_u32(vdupq_n_u32(lc_u32((const uint8_t *)x + h * u + 4 * g)));
            for (int q = 0; q < 4; q++) {
                int8x16_t cv = vld1q_s8(p + 16 * q);
                c[q] = vpadalq_s16(c[q], vmull_s8(vget_low_s8(cv), vget_low_s8(xb)));
                c2[q] = vpadalq_s16(c2[q], vmull_high_s8(cv, xb));
            }
        }
        const float *sp = scales + h * (u / 16) * 16;
        const float dx = xd[h * u / 4];
        for (int q = 0; q < 4; q++)
            acc[q] = vfmaq_f32(acc[q], vcvtq_f32_s32(vpaddq_s32(c[q], c2[q])), vmulq_n_f32(vld1q_f32(sp + 4 * q), dx));
    }
    for (int q = 0; q < 4; q++) vst1q_f32(v + 4 * q, acc[q]);
}
#endif

/* lc_iq_gemm.h's tile: the panel (per 4 values a 64-byte group, 4 codes of each of 16 weight rows; a float
   scale per 16 values and row) against activation rows t0 .. t0 + mr - 1, per unit of u (16 or 32) values
   of one scale. With sdot each group is four 16-byte loads of 4 rows x 4 codes and one sdot by element
   per load and activation row (its 4 activation bytes a lane of one 16-byte load), every load serving
   all mr rows; without it iqn_tile_row per row. */
static inline __attribute__((always_inline)) void LC_FN(iqg_tile)(const int mr, const int u, const uint8_t *codes,
                                                                  const float *scales, int64_t k, const int8_t *xq,
                                                                  const float *xd, int64_t t0, void *out,
                                                                  int out_bf16, int64_t ldo, int64_t r0, int cols) {
    float v[4][16];
#if LC_IQN_SDOT
    float32x4_t acc[4][4];
    for (int i = 0; i < mr; i++)
        for (int q = 0; q < 4; q++) acc[i][q] = vdupq_n_f32(0.0f);
    for (int64_t h = 0; h < k / u; h++) {
        int32x4_t c[4][4];
        for (int i = 0; i < mr; i++)
            for (int q = 0; q < 4; q++) c[i][q] = vdupq_n_s32(0);
        for (int gg = 0; gg < u / 16; gg++) { /* 4 groups: 16 activation bytes of each row */
            int8x16_t xv[4];
            for (int i = 0; i < mr; i++) xv[i] = vld1q_s8(xq + (t0 + i) * k + h * u + 16 * gg);
            for (int j = 0; j < 4; j++) {
                const int8_t *p = (const int8_t *)codes + (h * (u / 4) + 4 * gg + j) * 64;
                int8x16_t cv[4] = {vld1q_s8(p), vld1q_s8(p + 16), vld1q_s8(p + 32), vld1q_s8(p + 48)};
                for (int i = 0; i < mr; i++)
                    for (int q = 0; q < 4; q++) {
                        switch (j) { /* the lane must be a literal */
                        case 0: c[i][q] = vdotq_laneq_s32(c[i][q], cv[q], xv[i], 0); break;
                        case 1: c[i][q] = vdotq_laneq_s32(c[i][q], cv[q], xv[i], 1); break;
                        case 2: c[i][q] = vdotq_laneq_s32(c[i][q], cv[q], xv[i], 2); break;
                        default: c[i][q] = vdotq_laneq_s32(c[i][q], cv[q], xv[i], 3); break;
                        }
                    }
            }
        }
        const float *sp = scales + h * (u / 16) * 16;
        for (int i = 0; i < mr; i++) {
            float dx = xd[(t0 + i) * (k / 4) + h * u / 4];
            for (int q = 0; q < 4; q++)
                acc[i][q] = vfmaq_f32(acc[i][q], vcvtq_f32_s32(c[i][q]), vmulq_n_f32(vld1q_f32(sp + 4 * q), dx));
        }
    }
    for (int i = 0; i < mr; i++)
        for (int q = 0; q < 4; q++) vst1q_f32(v[i] + 4 * q, acc[i][q]);
#else
    for (int i = 0; i < mr; i++)
        LC_FN(iqn_tile_row)(u, codes, scales, k, xq + (t0 + i) * k, xd + (t0 + i) * (k / 4), v[i]);
#endif
    for (int i = 0; i < mr; i++) {
        if (!out_bf16 && cols == 16) memcpy((float *)out + (t0 + i) * ldo + r0, v[i], sizeof(v[i]));
        else
            for (int c0 = 0; c0 < cols; c0++) lc_store(out, out_bf16, (t0 + i) * ldo + r0 + c0, v[i][c0]);
    }
}
#undef LC_IQN_SDOT
