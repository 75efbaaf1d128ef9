/* Many activation rows on AVX2 (prefill, batched decode), the 256-bit sibling of lc_gemm512.h: a tile of
LC_HN weight rows is decoded once into an interleaved form where one 32-byte load holds 4 consecutive
codes of 8 output columns, so one vpmaddubsw against a broadcast activation group (4 int8) gives each
of 8 outputs two pair sums, and the tile is reused by every activation row, LC_HM rows at a time.
Integer sums become float once per 32 values (16 for Q5 and Q6_K), not per 4 as in `micro`'s
row-by-row dot products. Included by lc_impl.h.

Saturation (vpmaddubsw sums two u8 x s8 products into a saturating int16; activations are in
[-127, 127] by construction, lc_quantize clamps them):
  - 4-bit codes (Q4_0, Q4_1, Q4_K): a pair is at most 2 * 15 * 127 = 3810, and 8 pairs (32 values)
    summed in int16 at most 30480 < 32767: one widening per 32 values.
  - 5-bit codes (Q5_0, Q5_1, Q5_K): 2 * 31 * 127 = 7874, 4 pairs at most 31496: widened per 16 values.
  - Q6_K's 6-bit codes: 2 * 63 * 127 = 16002, two pairs at most 32004: widened per 8 values.
  - Q8_0's signed codes take the sign trick: |w| (0..128, -128 becomes the unsigned 128) times
    x * sign(w), so a pair is at most 2 * 128 * 127 = 32512 < 32767; widened after every pair. Its
    offset is then zero (the codes are not shifted by 128 as in the row decoders). */

#define LC_HN 16 /* weight rows per tile: two ymm of output columns */
#define LC_HM 3  /* activation rows per register block: 6 float + 6 integer accumulators of 16 ymm */

/* dst + c * dstride = 32-bit value c of each of the 8 rows at src (stride apart), c < 8: an 8 x 8
   transpose in registers (pair rows within 128-bit lanes, then swap lanes). Strides in 32-bit values. */
static inline void LC_FN(tr8)(const float *src, int64_t stride, float *dst, int64_t dstride) {
    __m256 r[8], t[8];
    for (int j = 0; j < 8; j++) r[j] = _mm256_loadu_ps(src + j * stride);
    for (int j = 0; j < 8; j += 2) {
        t[j] = _mm256_unpacklo_ps(r[j], r[j + 1]);
        t[j + 1] = _mm256_unpackhi_ps(r[j], r[j + 1]);
    }
    for (int j = 0; j < 8; j += 4) { /* r[j + m]: per lane L, value 4L + m of rows j..j+3 */
        r[j] = _mm256_shuffle_ps(t[j], t[j + 2], 0x44);
        r[j + 1] = _mm256_shuffle_ps(t[j], t[j + 2], 0xEE);
        r[j + 2] = _mm256_shuffle_ps(t[j + 1], t[j + 3], 0x44);
        r[j + 3] = _mm256_shuffle_ps(t[j + 1], t[j + 3], 0xEE);
    }
    for (int m = 0; m < 4; m++) {
        _mm256_storeu_ps(dst + m * dstride, _mm256_permute2f128_ps(r[m], r[4 + m], 0x20));
        _mm256_storeu_ps(dst + (4 + m) * dstride, _mm256_permute2f128_ps(r[m], r[4 + m], 0x31));
    }
}

/* out[c * LC_HN + j] = rows[j * n + c] (32-bit values, j < 8, c < n). */
static inline void LC_FN(columns8)(const float *rows, int64_t n, float *out) {
    int64_t c = 0;
    for (; c + 8 <= n; c += 8) LC_FN(tr8)(rows + c, n, out + c * LC_HN, LC_HN);
    for (; c < n; c++)
        for (int j = 0; j < 8; j++) out[c * LC_HN + j] = rows[j * n + c];
}

/* One row into codes[k], s16[k / 16] (scale per 16 values) and m16[k / 16] (offset per 16). */
static inline void LC_FN(gemm2_row)(int type, const uint8_t *w, int64_t k, uint8_t *c, float *lsrow, float *s16,
                                    float *m16) {
    if (type == LC_Q8_0) { /* the signed codes as they are, offset 0 (the sign trick above) */
        for (int64_t b = 0; b < k / 32; b++) {
            const uint8_t *blk = w + 34 * b;
            memcpy(c + 32 * b, blk + 2, 32);
            s16[2 * b] = s16[2 * b + 1] = _cvtsh_ss(lc_u16(blk));
            m16[2 * b] = m16[2 * b + 1] = 0.0f;
        }
        return;
    }
    if (type == LC_Q4_K) { /* the commonest type straight into this form, its scales as words */
        const __m256i low = _mm256_set1_epi8(15);
        for (int64_t b = 0; b < k / 256; b++) {
            const uint8_t *blk = w + 144 * b;
            __m256 scf, mnf;
            LC_FN(q4k_scales)(blk, &scf, &mnf);
            float sc[8], mn[8];
            _mm256_storeu_ps(sc, scf);
            _mm256_storeu_ps(mn, mnf);
            for (int j = 0; j < 16; j++) {
                s16[16 * b + j] = sc[j / 2];
                m16[16 * b + j] = mn[j / 2];
            }
            for (int j = 0; j < 8; j += 2) { /* 32 bytes: sub-block j in the low nibbles, j + 1 in the high */
                __m256i v = _mm256_loadu_si256((const __m256i *)(blk + 16 + 16 * j));
                _mm256_storeu_si256((__m256i *)(c + 256 * b + 32 * j), _mm256_and_si256(v, low));
                _mm256_storeu_si256((__m256i *)(c + 256 * b + 32 * j + 32),
                                    _mm256_and_si256(_mm256_srli_epi16(v, 4), low));
            }
        }
        return;
    }
    LC_FN(decode_row)(type, w, k, c, lsrow, m16);
    for (int64_t p = 0; p < k / 16; p++) s16[p] = lsrow[4 * p];
}

/* Rows n0..n1 of `w` into ci[g][column][4] (64 bytes per 4-value group g), lsT[p][column] and
   mcT[p][column] (scale and offset per 16 values p), 8 rows per register transpose. Columns past n1
   are zero and never stored. */
static void LC_FN(gemm2_tile)(int type, const uint8_t *w, int64_t n0, int64_t n1, int64_t k, int64_t row_bytes,
                              uint8_t *ci, float *lsT, float *mcT, uint8_t *crows, float *lsrow, float *s16,
                              float *mcrows) {
    for (int j = 0; j < LC_HN; j++) {
        if (n0 + j < n1) {
            LC_FN(gemm2_row)(type, w + (n0 + j) * row_bytes, k, crows + j * k, lsrow, s16 + j * (k / 16),
                             mcrows + j * (k / 16));
        } else {
            memset(crows + j * k, 0, (size_t)k);
            memset(s16 + j * (k / 16), 0, sizeof(float) * (size_t)(k / 16));
            memset(mcrows + j * (k / 16), 0, sizeof(float) * (size_t)(k / 16));
        }
    }
    for (int h = 0; h < LC_HN / 8; h++) {
        LC_FN(columns8)((const float *)(crows + 8 * h * k), k / 4, (float *)ci + 8 * h);
        LC_FN(columns8)(s16 + 8 * h * (k / 16), k / 16, lsT + 8 * h);
        LC_FN(columns8)(mcrows + 8 * h * (k / 16), k / 16, mcT + 8 * h);
    }
}

/* How a type's integer sums are kept (see the top of this file). */
enum { LC_G4 = 0, LC_G5 = 1, LC_G6 = 2, LC_G8 = 3 };

/* res[i][column] for `mr` activation rows against a decoded tile. Literal mr/kind after inlining. */
static inline __attribute__((always_inline)) void LC_FN(gemm2_block)(
    const int mr, const int kind, const uint8_t *ci, const float *lsT, const float *mcT, int64_t k,
    const int8_t *xq, const float *xd, const float *xs, float res[LC_HM][LC_HN]) {
    const int step = kind == LC_G4 || kind == LC_G8 ? 32 : 16, groups = step / 4, halves = step / 16;
    const int narrow = kind == LC_G4 || kind == LC_G5; /* int16 sums over the whole step */
    const __m256i ones = _mm256_set1_epi16(1);
    __m256 acc[LC_HM][2];
    for (int i = 0; i < LC_HM; i++) acc[i][0] = acc[i][1] = _mm256_setzero_ps();
    for (int64_t p = 0; p < k / step; p++) {
        __m256i s[LC_HM][2];
        for (int i = 0; i < mr; i++) s[i][0] = s[i][1] = _mm256_setzero_si256();
        const uint8_t *cg = ci + p * groups * 4 * LC_HN;
        const int8_t *xp = xq + p * step;
        /* kept rolled: unrolled, gcc hoisted the loads and broadcasts and spilled the accumulators */
#pragma GCC unroll 1
        for (int g = 0; g < groups; g += kind == LC_G6 ? 2 : 1) {
            __m256i w0 = _mm256_loadu_si256((const __m256i *)(cg + g * 4 * LC_HN));
            __m256i w1 = _mm256_loadu_si256((const __m256i *)(cg + g * 4 * LC_HN + 32));
            if (kind == LC_G6) { /* two groups' pair sums (each <= 16002) add in int16, then widen */
                __m256i w2 = _mm256_loadu_si256((const __m256i *)(cg + g * 4 * LC_HN + 64));
                __m256i w3 = _mm256_loadu_si256((const __m256i *)(cg + g * 4 * LC_HN + 96));
                for (int i = 0; i < mr; i++) {
                    int32_t xa, xb;
                    memcpy(&xa, xp + i * k + 4 * g, 4);
                    memcpy(&xb, xp + i * k + 4 * g + 4, 4);
                    __m256i va = _mm256_set1_epi32(xa), vb = _mm256_set1_epi32(xb);
                    __m256i p0 = _mm256_add_epi16(_mm256_maddubs_epi16(w0, va), _mm256_maddubs_epi16(w2, vb));
                    __m256i p1 = _mm256_add_epi16(_mm256_maddubs_epi16(w1, va), _mm256_maddubs_epi16(w3, vb));
                    s[i][0] = _mm256_add_epi32(s[i][0], _mm256_madd_epi16(p0, ones));
                    s[i][1] = _mm256_add_epi32(s[i][1], _mm256_madd_epi16(p1, ones));
                }
            } else if (kind == LC_G8) {
                __m256i a0 = _mm256_abs_epi8(w0), a1 = _mm256_abs_epi8(w1);
                for (int i = 0; i < mr; i++) {
                    int32_t x4;
                    memcpy(&x4, xp + i * k + 4 * g, 4);
                    __m256i xb = _mm256_set1_epi32(x4);
                    __m256i p0 = _mm256_maddubs_epi16(a0, _mm256_sign_epi8(xb, w0));
                    __m256i p1 = _mm256_maddubs_epi16(a1, _mm256_sign_epi8(xb, w1));
                    s[i][0] = _mm256_add_epi32(s[i][0], _mm256_madd_epi16(p0, ones));
                    s[i][1] = _mm256_add_epi32(s[i][1], _mm256_madd_epi16(p1, ones));
                }
            } else {
                for (int i = 0; i < mr; i++) {
                    int32_t x4;
                    memcpy(&x4, xp + i * k + 4 * g, 4);
                    __m256i xb = _mm256_set1_epi32(x4);
                    __m256i p0 = _mm256_maddubs_epi16(w0, xb), p1 = _mm256_maddubs_epi16(w1, xb);
                    if (narrow) {
                        s[i][0] = _mm256_add_epi16(s[i][0], p0);
                        s[i][1] = _mm256_add_epi16(s[i][1], p1);
                    } else {
                        s[i][0] = _mm256_add_epi32(s[i][0], _mm256_madd_epi16(p0, ones));
                        s[i][1] = _mm256_add_epi32(s[i][1], _mm256_madd_epi16(p1, ones));
                    }
                }
            }
        }
        int64_t q = p * halves; /* first 16-value part of this step */
        __m256 l0 = _mm256_loadu_ps(lsT + q * LC_HN), l1 = _mm256_loadu_ps(lsT + q * LC_HN + 8);
        for (int i = 0; i < mr; i++) {
            __m256 d = _mm256_set1_ps(xd[i * (k / 4) + p * (step / 4)]);
            __m256i s0 = narrow ? _mm256_madd_epi16(s[i][0], ones) : s[i][0];
            __m256i s1 = narrow ? _mm256_madd_epi16(s[i][1], ones) : s[i][1];
            acc[i][0] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s0), _mm256_mul_ps(l0, d), acc[i][0]);
            acc[i][1] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s1), _mm256_mul_ps(l1, d), acc[i][1]);
        }
        if (kind == LC_G8) continue; /* no offsets */
        for (int h = 0; h < halves; h++) {
            __m256 m0 = _mm256_loadu_ps(mcT + (q + h) * LC_HN), m1 = _mm256_loadu_ps(mcT + (q + h) * LC_HN + 8);
            for (int i = 0; i < mr; i++) {
                __m256 sx = _mm256_set1_ps(xs[i * LC_XS(k) + q + h]);
                acc[i][0] = _mm256_fmadd_ps(m0, sx, acc[i][0]);
                acc[i][1] = _mm256_fmadd_ps(m1, sx, acc[i][1]);
            }
        }
    }
    for (int i = 0; i < mr; i++) {
        _mm256_storeu_ps(res[i], acc[i][0]);
        _mm256_storeu_ps(res[i] + 8, acc[i][1]);
    }
}

#define LC_GEMM2_KIND(MR)                                                                                  \
    do {                                                                                                   \
        switch (kind) {                                                                                    \
        case LC_G4: LC_FN(gemm2_block)(MR, LC_G4, ci, lsT, mcT, k, xt, dt, st, res); break;                \
        case LC_G5: LC_FN(gemm2_block)(MR, LC_G5, ci, lsT, mcT, k, xt, dt, st, res); break;                \
        case LC_G6: LC_FN(gemm2_block)(MR, LC_G6, ci, lsT, mcT, k, xt, dt, st, res); break;                \
        default: LC_FN(gemm2_block)(MR, LC_G8, ci, lsT, mcT, k, xt, dt, st, res); break;                   \
        }                                                                                                  \
    } while (0)

/* Rows n0..n1 of the output for every activation row: one decoded tile, then LC_HM rows at a time. */
static void LC_FN(gemm2_rows)(int type, const uint8_t *w, int64_t n0, int64_t n1, int64_t k, int64_t row_bytes,
                              const int8_t *xq, const float *xd, const float *xs, int64_t t, void *out,
                              int out_bf16, int64_t ldo, uint8_t *c, float *ls, float *mc) {
    /* Scratch from lc_scratch(2 * LC_HN * k): c holds the interleaved tile then the decoded rows; ls one
       row's lane scales, every row's scale per 16, lsT and mcT; mc the rows' offsets per 16. */
    uint8_t *ci = c, *crows = c + LC_HN * k;
    float *s16 = ls + k / 4, *lsT = s16 + LC_HN * k / 16, *mcT = lsT + LC_HN * k / 16;
    LC_FN(gemm2_tile)(type, w, n0, n1, k, row_bytes, ci, lsT, mcT, crows, ls, s16, mc);
    const int kind = type == LC_Q8_0 ? LC_G8
                     : type == LC_Q6_K ? LC_G6
                     /* per-16 conversion, int16 sums over 16 values: 5-bit codes, and Q2_K/Q3_K's
                        per-16 scales (codes <= 7: far from saturating) */
                     : (type == LC_Q5_0 || type == LC_Q5_1 || type == LC_Q5_K || lc_scales_per16(type)) ? LC_G5
                                                                              : LC_G4;
    float res[LC_HM][LC_HN];
    int mr;
    for (int64_t t0 = 0; t0 < t; t0 += mr) {
        mr = (int)(t - t0 < LC_HM ? t - t0 : LC_HM);
        if (t - t0 == LC_HM + 1) mr = 2; /* 2 + 2 rows, not 3 + 1: a 1-row block reloads the tile for 1 row */
        const int8_t *xt = xq + t0 * k;
        const float *dt = xd + t0 * (k / 4), *st = xs + t0 * LC_XS(k);
        switch (mr) {
        case 3: LC_GEMM2_KIND(3); break;
        case 2: LC_GEMM2_KIND(2); break;
        default: LC_GEMM2_KIND(1); break;
        }
        for (int i = 0; i < mr; i++)
            for (int64_t j = 0; j < n1 - n0; j++) lc_store(out, out_bf16, (t0 + i) * ldo + n0 + j, res[i][j]);
    }
}
