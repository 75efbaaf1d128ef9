/* NVFP4, Q1_0 and Q2_0 (lc_lowbit.h) one-row / few-row kernels a block at a time: the block's bytes loaded
once and its scales decoded once (the generic 32-value loop, iq_row, re-derived both per 32 values from
the row and the sub-block index; NVFP4's two scale bytes per 32 in scalar code).

- NVFP4 (64 values, a UE4M3 scale per 16): the 4 scale bytes decoded together in vector lanes
  (lc_ue4m3_half's bit construction, exponent 0 as m 2^-10, the byte 0x7F as zero but 0xFF not). AVX-512:
  the block's 32 code bytes spread to one 512-bit register (each 16's 8 bytes twice in a 128-bit lane, the
  second copy's high nibbles), one shuffle of the table's magnitudes, the activations negated under the
  codes' sign bits, one vpdpbusd; AVX2: 32 values per step as lb_sub decodes them, the lane scales
  permuted out of the block's 4; NEON: lbn_sub's decode, the 4 scales in one register (fmla by lane).
- Q1_0 (128 values, a sign bit each): v = +1 / -1 is the activation with its sign flipped where the bit is
  clear, summed. AVX-512: the 64 bits of 64 values are a mask register as loaded: one masked subtract and
  one vpdpbusd against ones per 64 values. AVX2 / NEON: the bits spread to byte masks (one shuffle, and,
  compare per 32 values; NEON tbl and tst per 16), then a sign per byte.
- Q2_0 (64 values, 2-bit codes q, value q - 1; code j in bits 2 (j % 4) of byte j / 4): each code byte
  copied to its four values' bytes (one shuffle), each byte's own field masked in place (field m at bits
  2m), then looked up: fields 0 and 1 as the low nibble (values 0..3, or 0, 4, 8, 12), fields 2 and 3
  after a 16-bit shift right by 4 (the same index sets), one 16-entry table for all four; the two lookups
  merge by 16-bit words (fields 0, 1 in the low word of each 4 bytes). AVX-512 looks up |q - 1| and flips
  the activations where q = 0 (masked subtract, vpdpbusd); AVX2 looks up q - 1 (vpsign, vpmaddubsw);
  NEON shifts each byte right by 2 (j % 4) (ushl) and subtracts 1.

Every integer sum is exact, each 32 values' sum is scaled by the block's d times the activations' scale of
those 32 (iq_row's float expression), so results differ from iq_row only in the float summation order.
Included by lc_iquants.h (x86) and lc_iq_neon.h (aarch64), once per ISA variant (LC_FN). */

#if LC_ISA == LC_ISA_AVX2 || LC_ISA == LC_ISA_AVX512VNNI
#if LC_ISA == LC_ISA_AVX512VNNI
/* 64 activations of row i (xq + 64 g) with their signs flipped where `neg`, times unsigned u, in the float
   accumulator with scale d times the activations' lane scales (xd + 16 g). */
#define LC_LB_DOT64(acc, u, neg, d, g)                                                                       \
    do {                                                                                                     \
        __m512i x_ = _mm512_loadu_si512((const void *)(xq + i * k + 64 * (g)));                            \
        x_ = _mm512_mask_sub_epi8(x_, (neg), _mm512_setzero_si512(), x_);                                    \
        const __m512i p_ = _mm512_dpbusd_epi32(_mm512_setzero_si512(), (u), x_);                             \
        const __m512 f_ = _mm512_mul_ps((d), _mm512_loadu_ps(xd + i * (k / 4) + 16 * (g)));                \
        (acc) = _mm512_fmadd_ps(f_, _mm512_cvtepi32_ps(p_), (acc));                                          \
    } while (0)

/* Q2_0 block b: |q - 1| of its 64 values (64 bytes) and where q = 0 (the value -1). */
static inline __attribute__((always_inline)) void LC_FN(q2_dec64)(const uint8_t *b, __m512i *u, __mmask64 *neg) {
    const __m512i rep = _mm512_set_epi32(0x0F0F0F0F, 0x0E0E0E0E, 0x0D0D0D0D, 0x0C0C0C0C, 0x0B0B0B0B, 0x0A0A0A0A,
                                         0x09090909, 0x08080808, 0x07070707, 0x06060606, 0x05050505, 0x04040404,
                                         0x03030303, 0x02020202, 0x01010101, 0x00000000);
    const __m512i fields = _mm512_set1_epi32((int)0xC0300C03u);
    /* |q - 1| by index: q (fields 0 and 2 after the shift) or 4 q (fields 1 and 3) */
    const __m512i table = _mm512_broadcast_i32x4(_mm_setr_epi8(1, 0, 1, 2, 0, 0, 0, 0, 1, 0, 0, 0, 2, 0, 0, 0));
    const __m512i y = _mm512_shuffle_epi8(_mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)(b + 2))), rep);
    const __m512i t = _mm512_and_si512(y, fields);
    *u = _mm512_mask_blend_epi16((__mmask32)0xAAAAAAAAu, _mm512_shuffle_epi8(table, t),
                                 _mm512_shuffle_epi8(table, _mm512_srli_epi16(t, 4)));
    *neg = _mm512_testn_epi8_mask(y, fields);
}

/* NVFP4 block b: the magnitudes of its 64 values (the doubled E2M1 table), where they are negative, and
   the scale ue4m3 / 2 of each 16 (lc_ue4m3_half from the bytes' bits) over their 4-value lanes. */
static inline __attribute__((always_inline)) void LC_FN(nv_dec64)(const uint8_t *b, __m512i *u, __mmask64 *neg,
                                                                   __m512 *d) {
    const __m512i table = _mm512_broadcast_i32x4(_mm_setr_epi8(0, 1, 2, 3, 4, 6, 8, 12, 0, 1, 2, 3, 4, 6, 8, 12));
    /* each 16's 8 code bytes twice in its 128-bit lane, the second copy's high nibbles shifted down */
    __m512i q = _mm512_permutexvar_epi64(_mm512_setr_epi64(0, 0, 1, 1, 2, 2, 3, 3),
                                         _mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)(b + 4))));
    q = _mm512_and_si512(_mm512_mask_srli_epi16(q, (__mmask32)0xF0F0F0F0u, q, 4), _mm512_set1_epi8(15));
    *u = _mm512_shuffle_epi8(table, q);
    *neg = _mm512_test_epi8_mask(q, _mm512_set1_epi8(8));
    const __m512i raw = _mm512_and_si512(_mm512_srlv_epi32(_mm512_set1_epi32((int)lc_u32(b)),
                                                           _mm512_setr_epi32(0, 0, 0, 0, 8, 8, 8, 8, 16, 16, 16, 16, 24, 24, 24, 24)),
                                         _mm512_set1_epi32(0xFF));
    const __m512i x = _mm512_and_si512(raw, _mm512_set1_epi32(0x7F)); /* bit 7 ignored */
    const __m512 normal = _mm512_castsi512_ps(_mm512_add_epi32(_mm512_slli_epi32(x, 20), _mm512_set1_epi32(119 << 23)));
    const __m512 sub = _mm512_mul_ps(_mm512_cvtepi32_ps(x), _mm512_set1_ps(0.0009765625f)); /* exponent 0: m 2^-10 */
    const __m512 sc = _mm512_mask_mov_ps(normal, _mm512_cmplt_epi32_mask(x, _mm512_set1_epi32(8)), sub);
    *d = _mm512_maskz_mov_ps(_mm512_cmpneq_epi32_mask(raw, _mm512_set1_epi32(0x7F)), sc); /* 0x7F (not 0xFF): zero */
}

/* Block b of a 64-value type (`type` a literal): unsigned magnitudes, negative values, lane scales. */
static inline __attribute__((always_inline)) void LC_FN(lb_dec64)(const int type, const uint8_t *b, __m512i *u,
                                                                   __mmask64 *neg, __m512 *d) {
    if (type == LC_NVFP4) {
        LC_FN(nv_dec64)(b, u, neg, d);
    } else {
        LC_FN(q2_dec64)(b, u, neg);
        *d = _mm512_set1_ps(_cvtsh_ss(lc_u16(b)));
    }
}
#else
/* 32 activations of row i (xq + 32 g) times signed v (|v| = a), in the float accumulator as LC_LB_DOT64. */
#define LC_LB_DOT32(acc, a, v, d, g)                                                                         \
    do {                                                                                                     \
        const __m256i x_ = _mm256_sign_epi8(_mm256_loadu_si256((const __m256i *)(xq + i * k + 32 * (g))), (v)); \
        const __m256i p_ = _mm256_madd_epi16(_mm256_maddubs_epi16((a), x_), _mm256_set1_epi16(1));          \
        const __m256 f_ = _mm256_mul_ps((d), _mm256_loadu_ps(xd + i * (k / 4) + 8 * (g)));                  \
        (acc) = _mm256_fmadd_ps(f_, _mm256_cvtepi32_ps(p_), (acc));                                          \
    } while (0)

/* NVFP4 block b's 4 scales ue4m3 / 2 (lc_ue4m3_half from the bytes' bits, in SSE lanes). */
static inline __m128 LC_FN(nv_scales4)(const uint8_t *b) {
    const __m128i shifts = _mm_setr_epi32(0, 8, 16, 24);
    const __m128i raw = _mm_and_si128(_mm_srlv_epi32(_mm_set1_epi32((int)lc_u32(b)), shifts), _mm_set1_epi32(0xFF));
    const __m128i x = _mm_and_si128(raw, _mm_set1_epi32(0x7F)); /* bit 7 ignored */
    const __m128 normal = _mm_castsi128_ps(_mm_add_epi32(_mm_slli_epi32(x, 20), _mm_set1_epi32(119 << 23)));
    const __m128 sub = _mm_mul_ps(_mm_cvtepi32_ps(x), _mm_set1_ps(0.0009765625f)); /* exponent 0: m 2^-10 */
    const __m128 sc = _mm_blendv_ps(normal, sub, _mm_castsi128_ps(_mm_cmplt_epi32(x, _mm_set1_epi32(8))));
    return _mm_andnot_ps(_mm_castsi128_ps(_mm_cmpeq_epi32(raw, _mm_set1_epi32(0x7F))), sc); /* 0x7F (not 0xFF): zero */
}

/* Q2_0 sub-block h (0, 1) of the 16 code bytes c (in both 128-bit lanes): its 32 values q - 1. */
static inline __attribute__((always_inline)) __m256i LC_FN(q2_dec32)(__m256i c, const int h) {
    const __m256i rep = _mm256_add_epi8(_mm256_setr_epi32(0x00000000, 0x01010101, 0x02020202, 0x03030303, 0x04040404,
                                                          0x05050505, 0x06060606, 0x07070707),
                                        _mm256_set1_epi8((char)(8 * h)));
    const __m256i fields = _mm256_set1_epi32((int)0xC0300C03u);
    const __m256i table = _mm256_broadcastsi128_si256(_mm_setr_epi8(-1, 0, 1, 2, 0, 0, 0, 0, 1, 0, 0, 0, 2, 0, 0, 0));
    const __m256i t = _mm256_and_si256(_mm256_shuffle_epi8(c, rep), fields);
    return _mm256_blend_epi16(_mm256_shuffle_epi8(table, t), _mm256_shuffle_epi8(table, _mm256_srli_epi16(t, 4)), 0xAA);
}
#endif

/* Weight row `row` (Q1_0 or Q2_0 blocks, `type` a literal) times activation rows xq/xd [mr]: res[i]. Two
   float accumulators per row (even and odd steps). */
static inline __attribute__((always_inline)) void LC_FN(lb_brow)(const int type, const int mr, const uint8_t *row,
                                                                  int64_t k, const int8_t *xq, const float *xd,
                                                                  float *res) {
#if LC_ISA == LC_ISA_AVX512VNNI
    __m512 acc[4][2];
    for (int i = 0; i < 4; i++) acc[i][0] = acc[i][1] = _mm512_setzero_ps();
    if (type == LC_Q1_0) {
        const __m512i ones = _mm512_set1_epi8(1);
        for (int64_t ib = 0; ib < k / 128; ib++) {
            const uint8_t *b = row + 18 * ib;
            const __m512 d = _mm512_set1_ps(_cvtsh_ss(lc_u16(b)));
            uint64_t bits[2];
            memcpy(bits, b + 2, 16);
            for (int i = 0; i < mr; i++) {
                LC_LB_DOT64(acc[i][0], ones, _cvtu64_mask64(~bits[0]), d, 2 * ib);
                LC_LB_DOT64(acc[i][1], ones, _cvtu64_mask64(~bits[1]), d, 2 * ib + 1);
            }
        }
    } else { /* LC_Q2_0, LC_NVFP4: a block of 64 values per 512-bit step, two blocks per loop */
        const int64_t bytes = lc_block_bytes(type);
        int64_t ib = 0;
        for (; ib + 2 <= k / 64; ib += 2) {
            const uint8_t *b = row + bytes * ib;
            __m512i u0, u1;
            __mmask64 n0, n1;
            __m512 d0, d1;
            LC_FN(lb_dec64)(type, b, &u0, &n0, &d0);
            LC_FN(lb_dec64)(type, b + bytes, &u1, &n1, &d1);
            for (int i = 0; i < mr; i++) {
                LC_LB_DOT64(acc[i][0], u0, n0, d0, ib);
                LC_LB_DOT64(acc[i][1], u1, n1, d1, ib + 1);
            }
        }
        if (ib < k / 64) { /* an odd last block */
            __m512i u0;
            __mmask64 n0;
            __m512 d0;
            LC_FN(lb_dec64)(type, row + bytes * ib, &u0, &n0, &d0);
            for (int i = 0; i < mr; i++) LC_LB_DOT64(acc[i][0], u0, n0, d0, ib);
        }
    }
    for (int i = 0; i < mr; i++) res[i] = _mm512_reduce_add_ps(_mm512_add_ps(acc[i][0], acc[i][1]));
#else
    if (type == LC_NVFP4 && mr > 1) { /* 2-4 rows: iq_row measured ~10% faster (this loop's 16 live ymm spill) */
        LC_FN(iq_row)(type, mr, row, k, xq, xd, res);
        return;
    }
    __m256 acc[4][2];
    for (int i = 0; i < 4; i++) acc[i][0] = acc[i][1] = _mm256_setzero_ps();
    const __m256i one = _mm256_set1_epi8(1);
    if (type == LC_Q1_0) { /* bit j of the 4 bytes of sub-block s spread to byte j: +1 where set, -1 where clear */
        const __m256i spread = _mm256_setr_epi64x(0, 0x0101010101010101LL, 0x0202020202020202LL, 0x0303030303030303LL);
        const __m256i bit = _mm256_set1_epi64x((int64_t)0x8040201008040201ULL);
        for (int64_t ib = 0; ib < k / 128; ib++) {
            const uint8_t *b = row + 18 * ib;
            const __m256 d = _mm256_set1_ps(_cvtsh_ss(lc_u16(b)));
            const __m256i w = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)(b + 2)));
            for (int s = 0; s < 4; s++) {
                const __m256i m = _mm256_shuffle_epi8(w, _mm256_add_epi8(spread, _mm256_set1_epi8((char)(4 * s))));
                const __m256i v = _mm256_or_si256(_mm256_cmpeq_epi8(_mm256_and_si256(m, bit), _mm256_setzero_si256()), one);
                for (int i = 0; i < mr; i++) LC_LB_DOT32(acc[i][s & 1], one, v, d, 4 * ib + s);
            }
        }
    } else if (type == LC_NVFP4) { /* per 32: 16 code bytes, low nibbles then high ones per 16 values */
        const __m256i table = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)lc_mxfp4_values));
        const __m128i low4 = _mm_set1_epi8(15);
        for (int64_t ib = 0; ib < k / 64; ib++) {
            const uint8_t *b = row + 36 * ib;
            const __m256 sc = _mm256_castps128_ps256(LC_FN(nv_scales4)(b));
            for (int h = 0; h < 2; h++) {
                const __m128i q = _mm_loadu_si128((const __m128i *)(b + 4 + 16 * h));
                const __m128i lo = _mm_and_si128(q, low4), hi = _mm_and_si128(_mm_srli_epi16(q, 4), low4);
                const __m256i idx = _mm256_set_m128i(_mm_unpackhi_epi64(lo, hi), _mm_unpacklo_epi64(lo, hi));
                const __m256i v = _mm256_shuffle_epi8(table, idx);
                const __m256i pick = _mm256_add_epi32(_mm256_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1), _mm256_set1_epi32(2 * h));
                const __m256 d = _mm256_permutevar8x32_ps(sc, pick); /* the scales of 16-value groups 2h, 2h + 1 */
                const __m256i a = _mm256_sign_epi8(v, v);
                for (int i = 0; i < mr; i++) LC_LB_DOT32(acc[i][h], a, v, d, 2 * ib + h);
            }
        }
    } else { /* LC_Q2_0 */
        for (int64_t ib = 0; ib < k / 64; ib++) {
            const uint8_t *b = row + 18 * ib;
            const __m256 d = _mm256_set1_ps(_cvtsh_ss(lc_u16(b)));
            const __m256i c = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)(b + 2)));
            const __m256i v0 = LC_FN(q2_dec32)(c, 0), v1 = LC_FN(q2_dec32)(c, 1);
            const __m256i a0 = _mm256_sign_epi8(v0, v0), a1 = _mm256_sign_epi8(v1, v1);
            for (int i = 0; i < mr; i++) {
                LC_LB_DOT32(acc[i][0], a0, v0, d, 2 * ib);
                LC_LB_DOT32(acc[i][1], a1, v1, d, 2 * ib + 1);
            }
        }
    }
    for (int i = 0; i < mr; i++) res[i] = LC_FN(hsum)(_mm256_add_ps(acc[i][0], acc[i][1]));
#endif
}
#undef LC_LB_DOT64
#undef LC_LB_DOT32
#elif defined(__aarch64__) && defined(__ARM_NEON) /* inside lc_iq_neon.h: iqn_dot16, iqn_f16, the spread tables */
/* Sub-block s's 32 values v0 (0-15), v1 (16-31) times activation rows xq/xd [mr] into acc[mr], scale d. */
static inline __attribute__((always_inline)) void LC_FN(lbn_step)(const int mr, int8x16_t v0, int8x16_t v1, float d,
                                                                   int64_t s, int64_t k, const int8_t *xq,
                                                                   const float *xd, float32x4_t *acc) {
    for (int r = 0; r < mr; r++) {
        const int8_t *x = xq + r * k + 32 * s;
        int32x4_t p = LC_FN(iqn_dot16)(LC_FN(iqn_dot16)(vdupq_n_s32(0), v0, vld1q_s8(x)), v1, vld1q_s8(x + 16));
        acc[r] = vfmaq_n_f32(acc[r], vcvtq_f32_s32(p), d * xd[r * (k / 4) + 8 * s]);
    }
}

/* As the x86 lb_brow: weight row `row` of Q1_0 or Q2_0 blocks (`type` a literal) times activation rows
   xq/xd [mr]: res[i]; even and odd sub-blocks in separate accumulators. */
static inline __attribute__((always_inline)) void LC_FN(lbn_brow)(const int type, const int mr, const uint8_t *row,
                                                                   int64_t k, const int8_t *xq, const float *xd,
                                                                   float *res) {
    float32x4_t acc[2][4];
    for (int r = 0; r < mr; r++) acc[0][r] = acc[1][r] = vdupq_n_f32(0.0f);
    if (type == LC_Q1_0) { /* -1 where set, +1 where clear (the byte mask | 1), so the scale is -d */
        const uint8x16_t bits = vld1q_u8(lc_iqn_bits), one = vdupq_n_u8(1);
        const uint8x16_t sel0 = vld1q_u8(lc_iqn_spread[0]), sel1 = vld1q_u8(lc_iqn_spread[1]);
        for (int64_t ib = 0; ib < k / 128; ib++) {
            const uint8_t *b = row + 18 * ib;
            const float d = -LC_FN(iqn_f16)(b);
            const uint8x16_t w = vld1q_u8(b + 2);
            for (int s = 0; s < 4; s++) {
                const uint8x16_t off = vdupq_n_u8((uint8_t)(4 * s));
                const int8x16_t v0 = vreinterpretq_s8_u8(vorrq_u8(vtstq_u8(vqtbl1q_u8(w, vaddq_u8(sel0, off)), bits), one));
                const int8x16_t v1 = vreinterpretq_s8_u8(vorrq_u8(vtstq_u8(vqtbl1q_u8(w, vaddq_u8(sel1, off)), bits), one));
                LC_FN(lbn_step)(mr, v0, v1, d, 4 * ib + s, k, xq, xd, acc[s & 1]);
            }
        }
    } else if (type == LC_NVFP4) { /* the 4 scale bytes in vector lanes (as x86's nv_scales4), a scale per 16 */
        const int8x16_t table = vld1q_s8(lc_mxfp4_values);
        const uint8x16_t low4 = vdupq_n_u8(15);
        const int32x4_t down = {0, -8, -16, -24};
        for (int64_t ib = 0; ib < k / 64; ib++) {
            const uint8_t *b = row + 36 * ib;
            const uint32x4_t raw = vandq_u32(vshlq_u32(vdupq_n_u32(lc_u32(b)), down), vdupq_n_u32(0xFF));
            const uint32x4_t x = vandq_u32(raw, vdupq_n_u32(0x7F)); /* bit 7 ignored */
            const float32x4_t normal = vreinterpretq_f32_u32(vaddq_u32(vshlq_n_u32(x, 20), vdupq_n_u32(119u << 23)));
            const float32x4_t sub = vmulq_n_f32(vcvtq_f32_u32(x), 0.0009765625f); /* exponent 0: m 2^-10 */
            float32x4_t sc = vbslq_f32(vcltq_u32(x, vdupq_n_u32(8)), sub, normal);
            sc = vreinterpretq_f32_u32(vbicq_u32(vreinterpretq_u32_f32(sc), vceqq_u32(raw, vdupq_n_u32(0x7F))));
            for (int h = 0; h < 2; h++) {
                const uint8x16_t q = vld1q_u8(b + 4 + 16 * h);
                const uint8x16_t lo = vandq_u8(q, low4), hi = vshrq_n_u8(q, 4);
                const int8x16_t v0 = vqtbl1q_s8(table, vcombine_u8(vget_low_u8(lo), vget_low_u8(hi)));
                const int8x16_t v1 = vqtbl1q_s8(table, vcombine_u8(vget_high_u8(lo), vget_high_u8(hi)));
                const int64_t s = 2 * ib + h;
                for (int r = 0; r < mr; r++) {
                    const int8_t *xr = xq + r * k + 32 * s;
                    const float32x4_t f = vmulq_n_f32(sc, xd[r * (k / 4) + 8 * s]); /* d * dx, as iqn_step */
                    const int32x4_t p0 = LC_FN(iqn_dot16)(vdupq_n_s32(0), v0, vld1q_s8(xr));
                    const int32x4_t p1 = LC_FN(iqn_dot16)(vdupq_n_s32(0), v1, vld1q_s8(xr + 16));
                    float32x4_t a = acc[h][r];
                    a = h ? vfmaq_laneq_f32(a, vcvtq_f32_s32(p0), f, 2) : vfmaq_laneq_f32(a, vcvtq_f32_s32(p0), f, 0);
                    a = h ? vfmaq_laneq_f32(a, vcvtq_f32_s32(p1), f, 3) : vfmaq_laneq_f32(a, vcvtq_f32_s32(p1), f, 1);
                    acc[h][r] = a;
                }
            }
        }
    } else { /* LC_Q2_0: byte j / 4 to byte j, shifted right by 2 (j % 4), masked, minus 1 */
        static const uint8_t rep[16] = {0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3};
        static const int8_t shift[16] = {0, -2, -4, -6, 0, -2, -4, -6, 0, -2, -4, -6, 0, -2, -4, -6};
        const uint8x16_t r0 = vld1q_u8(rep), three = vdupq_n_u8(3);
        const int8x16_t sh = vld1q_s8(shift), one = vdupq_n_s8(1);
        for (int64_t ib = 0; ib < k / 64; ib++) {
            const uint8_t *b = row + 18 * ib;
            const float d = LC_FN(iqn_f16)(b);
            const uint8x16_t c = vld1q_u8(b + 2);
            for (int h = 0; h < 2; h++) {
                const uint8x16_t q0 = vqtbl1q_u8(c, vaddq_u8(r0, vdupq_n_u8((uint8_t)(8 * h))));
                const uint8x16_t q1 = vqtbl1q_u8(c, vaddq_u8(r0, vdupq_n_u8((uint8_t)(8 * h + 4))));
                const int8x16_t v0 = vsubq_s8(vreinterpretq_s8_u8(vandq_u8(vshlq_u8(q0, sh), three)), one);
                const int8x16_t v1 = vsubq_s8(vreinterpretq_s8_u8(vandq_u8(vshlq_u8(q1, sh), three)), one);
                LC_FN(lbn_step)(mr, v0, v1, d, 2 * ib + h, k, xq, xd, acc[h]);
            }
        }
    }
    for (int r = 0; r < mr; r++) res[r] = vaddvq_f32(vaddq_f32(acc[0][r], acc[1][r]));
}
#endif
