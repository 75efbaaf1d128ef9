/* GGML's NVFP4 (type 40), Q1_0 (41) and Q2_0 (42), run by the i-quant kernels (lc_iquants.h) as one more
set of "int8 values times a float scale per 16 or 32" blocks:

- NVFP4: 64 values in 36 bytes: 4 unsigned-E4M3 scale bytes (one per 16 values), then 32 bytes of E2M1
  codes, 8 per 16 values (value j of a 16 in the low nibble of byte j, value j + 8 in the high one). The
  E2M1 values are MXFP4's doubled table (lc_mxfp4.h), so the scale is halved: ue4m3(x) / 2, exact for
  every byte (bytes 0 and 0x7F are zero, bit 7 ignored, as ggml's ggml_ue4m3_to_fp32).
- Q1_0: 128 values in 18 bytes: an f16 scale d, then one bit per value (bit j % 8 of byte j / 8): value
  +d where set, -d where clear (Bonsai-style 1-bit models). Decoded as +-1 times d.
- Q2_0: 64 values in 18 bytes: an f16 scale d, then 2-bit codes q (value j in bits 2 (j % 4) of byte
  j / 4): value (q - 1) d, so -d, 0, d or 2d. Decoded as q - 1 times d.

Each 32-value sub-block of these decodes to the same v[32] / two scales as the i-quants, and
`scale * value` is the reference dequantizer's own float32 product, so dequantizing is bit-exact with
ggml (and gguf.quants for NVFP4). The first part is the portable decoder (lc_iq_dec calls it); the
per-ISA part, re-included with lc_iquants.h, decodes a sub-block in registers. */
#ifndef LC_LOWBIT_H
#define LC_LOWBIT_H

static inline int lc_is_lowbit(int type) { return type == LC_NVFP4 || type == LC_Q1_0 || type == LC_Q2_0; }

/* ue4m3(x) / 2: (8 + m) 2^(e - 11) for an exponent field e > 0, i.e. the float32 with exponent e - 8 and
   mantissa m << 20, built from its bits (ldexpf, a libm call, made a one-row NVFP4 step 5x slower); m 2^-10
   for e = 0. Exact in float32. */
static inline float lc_ue4m3_half(uint8_t x) {
    if (x == 0 || x == 0x7F) return 0.0f;
    uint32_t e = (x >> 3) & 15u, m = x & 7u;
    if (e == 0) return (float)m * 0.0009765625f;
    uint32_t bits = ((e + 119u) << 23) | (m << 20);
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

/* Sub-block s of block b: v[32] and the scale of each 16 values sc[2] (lc_iq_dec's contract). */
static void lc_lb_dec(int type, const uint8_t *b, int s, int8_t *v, float *sc) {
    if (type == LC_NVFP4) {
        for (int h = 0; h < 2; h++) {
            const uint8_t *qs = b + 4 + 16 * s + 8 * h;
            for (int j = 0; j < 8; j++) {
                v[16 * h + j] = lc_mxfp4_values[qs[j] & 15];
                v[16 * h + j + 8] = lc_mxfp4_values[qs[j] >> 4];
            }
            sc[h] = lc_ue4m3_half(b[2 * s + h]);
        }
    } else if (type == LC_Q1_0) {
        const uint8_t *qs = b + 2 + 4 * s;
        for (int j = 0; j < 32; j++) v[j] = (qs[j / 8] >> (j % 8)) & 1 ? 1 : -1;
        sc[0] = sc[1] = lc_f16(lc_u16(b));
    } else { /* LC_Q2_0 */
        const uint8_t *qs = b + 2 + 8 * s;
        for (int j = 0; j < 32; j++) v[j] = (int8_t)(((qs[j / 4] >> (2 * (j % 4))) & 3) - 1);
        sc[0] = sc[1] = lc_f16(lc_u16(b));
    }
}
#endif /* LC_LOWBIT_H */

#if defined(LC_FN) && (LC_ISA == LC_ISA_AVX2 || LC_ISA == LC_ISA_AVX512VNNI)
/* Sub-block s of a row in registers (lc_iquants.h's iq_sub contract: 32 signed values in order and the
   scale of each 4-value lane), the scales lc_lb_dec's. */
static inline __attribute__((always_inline)) void LC_FN(lb_sub)(const int type, const uint8_t *row, int64_t s,
                                                                 __m256i *v, __m256 *lsv) {
    if (type == LC_NVFP4) { /* 16 code bytes: per 16 values, low nibbles then high ones */
        const uint8_t *b = row + 36 * (s / 2);
        const int i = (int)(s % 2);
        const __m128i q = _mm_loadu_si128((const __m128i *)(b + 4 + 16 * i)), mask = _mm_set1_epi8(15);
        const __m128i lo = _mm_and_si128(q, mask), hi = _mm_and_si128(_mm_srli_epi16(q, 4), mask);
        const __m256i idx = _mm256_set_m128i(_mm_unpackhi_epi64(lo, hi), _mm_unpacklo_epi64(lo, hi));
        *v = _mm256_shuffle_epi8(_mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)lc_mxfp4_values)), idx);
        *lsv = _mm256_setr_m128(_mm_set1_ps(lc_ue4m3_half(b[2 * i])), _mm_set1_ps(lc_ue4m3_half(b[2 * i + 1])));
    } else if (type == LC_Q1_0) { /* the 32 bits spread to bytes: +1 where set, -1 where clear */
        const uint8_t *b = row + 18 * (s / 4);
        const __m256i spread = _mm256_setr_epi64x(0, 0x0101010101010101LL, 0x0202020202020202LL, 0x0303030303030303LL);
        const __m256i bits = _mm256_set1_epi64x((int64_t)0x8040201008040201ULL);
        __m256i m = _mm256_shuffle_epi8(_mm256_set1_epi32((int)lc_u32(b + 2 + 4 * (s % 4))), spread);
        m = _mm256_cmpeq_epi8(_mm256_and_si256(m, bits), bits); /* -1 where set */
        *v = _mm256_sub_epi8(_mm256_and_si256(m, _mm256_set1_epi8(2)), _mm256_set1_epi8(1)); /* 2 or 0, - 1 */
        *lsv = _mm256_set1_ps(_cvtsh_ss(lc_u16(b)));
    } else { /* LC_Q2_0: byte j / 4 copied to byte j, then field j % 4 of it masked in place */
        const uint8_t *b = row + 18 * (s / 2);
        int64_t q8;
        memcpy(&q8, b + 2 + 8 * (s % 2), 8);
        const __m256i rep = _mm256_setr_epi8(0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3, 4, 4, 4, 4, 5, 5, 5, 5,
                                             6, 6, 6, 6, 7, 7, 7, 7);
        const __m256i y = _mm256_shuffle_epi8(_mm256_set1_epi64x(q8), rep);
        __m256i q = _mm256_and_si256(y, _mm256_set1_epi32(0x00000003));
        q = _mm256_or_si256(q, _mm256_and_si256(_mm256_srli_epi32(y, 2), _mm256_set1_epi32(0x00000300)));
        q = _mm256_or_si256(q, _mm256_and_si256(_mm256_srli_epi32(y, 4), _mm256_set1_epi32(0x00030000)));
        q = _mm256_or_si256(q, _mm256_and_si256(_mm256_srli_epi32(y, 6), _mm256_set1_epi32(0x03000000)));
        *v = _mm256_sub_epi8(q, _mm256_set1_epi8(1));
        *lsv = _mm256_set1_ps(_cvtsh_ss(lc_u16(b)));
    }
}
#endif

#if defined(LC_FN) && !(LC_ISA == LC_ISA_AVX2 || LC_ISA == LC_ISA_AVX512VNNI) && defined(__aarch64__) &&          \
    defined(__ARM_NEON)
#include <arm_neon.h>
/* Sub-block i of the block at b in two NEON registers (lc_iq_neon.h's iqn_sub contract: values 0-15 in *v0,
   16-31 in *v1, d[0] / d[1] the scales of the two halves), the same values and scales as lc_lb_dec. */
static inline __attribute__((always_inline)) void LC_FN(lbn_sub)(const int type, const uint8_t *b, const int i,
                                                                  int8x16_t *v0, int8x16_t *v1, float *d) {
    if (type == LC_NVFP4) {
        const int8x16_t table = vld1q_s8(lc_mxfp4_values);
        const uint8x16_t q = vld1q_u8(b + 4 + 16 * i), mask = vdupq_n_u8(15);
        const uint8x16_t lo = vandq_u8(q, mask), hi = vshrq_n_u8(q, 4);
        *v0 = vqtbl1q_s8(table, vcombine_u8(vget_low_u8(lo), vget_low_u8(hi)));
        *v1 = vqtbl1q_s8(table, vcombine_u8(vget_high_u8(lo), vget_high_u8(hi)));
        d[0] = lc_ue4m3_half(b[2 * i]);
        d[1] = lc_ue4m3_half(b[2 * i + 1]);
    } else if (type == LC_Q1_0) { /* bit j % 8 of byte j / 8 spread to a byte mask, then +1 / -1 */
        static const uint8_t sel[2][16] = {{0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1},
                                           {2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3}};
        static const uint8_t bit[16] = {1, 2, 4, 8, 16, 32, 64, 128, 1, 2, 4, 8, 16, 32, 64, 128};
        const uint8x16_t w = vreinterpretq_u8_u32(vdupq_n_u32(lc_u32(b + 2 + 4 * i))), bits = vld1q_u8(bit);
        const int8x16_t one = vdupq_n_s8(1);
        for (int h = 0; h < 2; h++) {
            int8x16_t m = vreinterpretq_s8_u8(vtstq_u8(vqtbl1q_u8(w, vld1q_u8(sel[h])), bits)); /* -1 where set */
            int8x16_t r = vsubq_s8(vandq_s8(m, vdupq_n_s8(2)), one); /* 2 or 0, - 1 */
            if (h == 0) *v0 = r;
            else *v1 = r;
        }
        d[0] = d[1] = lc_f16(lc_u16(b));
    } else { /* LC_Q2_0: byte j / 4 to byte j, shifted right by 2 (j % 4) */
        static const uint8_t rep[2][16] = {{0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3},
                                           {4, 4, 4, 4, 5, 5, 5, 5, 6, 6, 6, 6, 7, 7, 7, 7}};
        static const int8_t shift[16] = {0, -2, -4, -6, 0, -2, -4, -6, 0, -2, -4, -6, 0, -2, -4, -6};
        const uint8x16_t q = vcombine_u8(vld1_u8(b + 2 + 8 * i), vdup_n_u8(0));
        const int8x16_t sh = vld1q_s8(shift), one = vdupq_n_s8(1);
        const uint8x16_t three = vdupq_n_u8(3);
        *v0 = vsubq_s8(vreinterpretq_s8_u8(vandq_u8(vshlq_u8(vqtbl1q_u8(q, vld1q_u8(rep[0])), sh), three)), one);
        *v1 = vsubq_s8(vreinterpretq_s8_u8(vandq_u8(vshlq_u8(vqtbl1q_u8(q, vld1q_u8(rep[1])), sh), three)), one);
        d[0] = d[1] = lc_f16(lc_u16(b));
    }
}
#endif
