/* Many activation rows on AVX-512 VNNI (prefill, batched decode): a tile of LC_GN weight rows is decoded
once into an interleaved form where one 64-byte load holds 4 consecutive codes of 16 output columns, so
each vpdpbusd against one broadcast activation group adds 4 products to 16 outputs at once. Integer sums
are converted to float once per 32 values (16 for Q6_K, whose scales change every 16), not per 4 as in
a row-by-row dot product: about twice the products per instruction of the 4 x 2 tiles AVX2 keeps
(`micro`). Included by lc_impl.h. */

#define LC_GN 32 /* weight rows per tile: two zmm of output columns */
#define LC_GM 4  /* activation rows per register block */

/* dst row c (64 bytes, dstride apart) = dword c of each of the 16 source rows (64 bytes, stride apart):
   a 16 x 16 transpose of 32-bit values in registers (unpack within 128-bit lanes, then move lanes). */
static inline void LC_FN(tr16)(const uint8_t *src, int64_t stride, uint8_t *dst, int64_t dstride) {
    __m512i r[16], t[16];
    for (int j = 0; j < 16; j++) r[j] = _mm512_loadu_si512((const void *)(src + j * stride));
    for (int j = 0; j < 16; j += 2) {
        t[j] = _mm512_unpacklo_epi32(r[j], r[j + 1]);
        t[j + 1] = _mm512_unpackhi_epi32(r[j], r[j + 1]);
    }
    for (int j = 0; j < 16; j += 4) { /* r[j + m]: per lane L, column 4L + m of rows j..j+3 */
        r[j] = _mm512_unpacklo_epi64(t[j], t[j + 2]);
        r[j + 1] = _mm512_unpackhi_epi64(t[j], t[j + 2]);
        r[j + 2] = _mm512_unpacklo_epi64(t[j + 1], t[j + 3]);
        r[j + 3] = _mm512_unpackhi_epi64(t[j + 1], t[j + 3]);
    }
    for (int m = 0; m < 4; m++) {
        __m512i v0 = _mm512_shuffle_i32x4(r[m], r[4 + m], 0x44), v1 = _mm512_shuffle_i32x4(r[m], r[4 + m], 0xEE);
        __m512i w0 = _mm512_shuffle_i32x4(r[8 + m], r[12 + m], 0x44), w1 = _mm512_shuffle_i32x4(r[8 + m], r[12 + m], 0xEE);
        _mm512_storeu_si512((void *)(dst + m * dstride), _mm512_shuffle_i32x4(v0, w0, 0x88));
        _mm512_storeu_si512((void *)(dst + (4 + m) * dstride), _mm512_shuffle_i32x4(v0, w0, 0xDD));
        _mm512_storeu_si512((void *)(dst + (8 + m) * dstride), _mm512_shuffle_i32x4(v1, w1, 0x88));
        _mm512_storeu_si512((void *)(dst + (12 + m) * dstride), _mm512_shuffle_i32x4(v1, w1, 0xDD));
    }
}

/* out[c * LC_GN + j] = rows[j * n + c] (32-bit values, j < 16, c < n): whole 16 x 16 blocks in registers,
   the last n % 16 columns by gathers. */
static inline void LC_FN(columns16)(const uint8_t *rows, int64_t n, uint8_t *out) {
    int64_t c = 0;
    for (; c + 16 <= n; c += 16) LC_FN(tr16)(rows + 4 * c, 4 * n, out + 4 * c * LC_GN, 4 * LC_GN);
    const __m512i idx = _mm512_mullo_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
                                           _mm512_set1_epi32((int)n));
    for (; c < n; c++)
        _mm512_storeu_si512((void *)(out + 4 * c * LC_GN), _mm512_i32gather_epi32(idx, (const void *)(rows + 4 * c), 4));
}

/* One row into codes[k], s16[k / 16] (scale per 16 values) and m16[k / 16] (offset per 16). Q4_K, the
   commonest type, is decoded straight into that form (its scales as words, q4k_scales); the others go
   through decode_row's per-lane form. */
static inline void LC_FN(gemm_row)(int type, const uint8_t *w, int64_t k, uint8_t *c, float *lsrow, float *s16,
                                   float *m16) {
    if (type == LC_Q4_K) {
        const __m256i low = _mm256_set1_epi8(15);
        for (int64_t b = 0; b < k / 256; b++) {
            const uint8_t *blk = w + 144 * b;
            __m256 scf, mnf;
            LC_FN(q4k_scales)(blk, &scf, &mnf);
            _mm512_storeu_ps(s16 + 16 * b, LC_FN(per16)(scf));
            _mm512_storeu_ps(m16 + 16 * b, LC_FN(per16)(mnf));
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

/* Rows n0..n1 of `w` into ci[g][column][4] (128 bytes per 4-value group g), lsT[p][column] and
   mcT[p][column] (scale and offset per 16 values p): each row is decoded, then every 16 rows are
   transposed in registers (stores scattered 4 bytes per cache line were most of a 16-row step's time).
   Columns past n1 are zero and never stored. */
static void LC_FN(gemm_tile)(int type, const uint8_t *w, int64_t n0, int64_t n1, int64_t k, int64_t row_bytes,
                             uint8_t *ci, float *lsT, float *mcT, uint8_t *crows, float *lsrows, float *s16,
                             float *mcrows) {
    for (int j = 0; j < LC_GN; j++) {
        if (n0 + j < n1) {
            LC_FN(gemm_row)(type, w + (n0 + j) * row_bytes, k, crows + j * k, lsrows, s16 + j * (k / 16),
                            mcrows + j * (k / 16));
        } else {
            memset(crows + j * k, 0, (size_t)k);
            memset(s16 + j * (k / 16), 0, sizeof(float) * (size_t)(k / 16));
            memset(mcrows + j * (k / 16), 0, sizeof(float) * (size_t)(k / 16));
        }
    }
    for (int h = 0; h < LC_GN / 16; h++) {
        LC_FN(columns16)(crows + 16 * h * k, k / 4, ci + 64 * h);
        LC_FN(columns16)((const uint8_t *)(s16 + 16 * h * (k / 16)), k / 16, (uint8_t *)(lsT + 16 * h));
        LC_FN(columns16)((const uint8_t *)(mcrows + 16 * h * (k / 16)), k / 16, (uint8_t *)(mcT + 16 * h));
    }
}

/* res[i][column] for `mr` activation rows against a decoded tile; `step` (16 or 32) values per float
   conversion. Literal mr/step after inlining. */
static inline __attribute__((always_inline)) void LC_FN(gemm_block)(
    const int mr, const int step, const uint8_t *ci, const float *lsT, const float *mcT, int64_t k,
    const int8_t *xq, const float *xd, const float *xs, float res[LC_GM][LC_GN]) {
    __m512 acc[LC_GM][2];
    for (int i = 0; i < LC_GM; i++) acc[i][0] = acc[i][1] = _mm512_setzero_ps();
    const int groups = step / 4, halves = step / 16;
    for (int64_t p = 0; p < k / step; p++) {
        __m512i ai[LC_GM][2];
        for (int i = 0; i < mr; i++) ai[i][0] = ai[i][1] = _mm512_setzero_si512();
        const uint8_t *cg = ci + p * groups * 4 * LC_GN;
        for (int g = 0; g < groups; g++) {
            __m512i w0 = _mm512_loadu_si512((const void *)(cg + g * 4 * LC_GN));
            __m512i w1 = _mm512_loadu_si512((const void *)(cg + g * 4 * LC_GN + 64));
            for (int i = 0; i < mr; i++) {
                int32_t x4;
                memcpy(&x4, xq + i * k + p * step + 4 * g, 4);
                __m512i xb = _mm512_set1_epi32(x4);
                ai[i][0] = _mm512_dpbusd_epi32(ai[i][0], w0, xb);
                ai[i][1] = _mm512_dpbusd_epi32(ai[i][1], w1, xb);
            }
        }
        int64_t q = p * halves; /* first 16-value part of this chunk */
        __m512 l0 = _mm512_loadu_ps(lsT + q * LC_GN), l1 = _mm512_loadu_ps(lsT + q * LC_GN + 16);
        for (int i = 0; i < mr; i++) {
            __m512 d = _mm512_set1_ps(xd[i * (k / 4) + p * (step / 4)]);
            acc[i][0] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(ai[i][0]), _mm512_mul_ps(l0, d), acc[i][0]);
            acc[i][1] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(ai[i][1]), _mm512_mul_ps(l1, d), acc[i][1]);
        }
        for (int h = 0; h < halves; h++) {
            __m512 m0 = _mm512_loadu_ps(mcT + (q + h) * LC_GN), m1 = _mm512_loadu_ps(mcT + (q + h) * LC_GN + 16);
            for (int i = 0; i < mr; i++) {
                __m512 s = _mm512_set1_ps(xs[i * LC_XS(k) + q + h]);
                acc[i][0] = _mm512_fmadd_ps(m0, s, acc[i][0]);
                acc[i][1] = _mm512_fmadd_ps(m1, s, acc[i][1]);
            }
        }
    }
    for (int i = 0; i < mr; i++) {
        _mm512_storeu_ps(res[i], acc[i][0]);
        _mm512_storeu_ps(res[i] + 16, acc[i][1]);
    }
}

#define LC_GEMM_BLOCK(MR)                                                                                  \
    do {                                                                                                   \
        if (step == 16) LC_FN(gemm_block)(MR, 16, ci, lsT, mcT, k, xt, dt, st, res);                       \
        else LC_FN(gemm_block)(MR, 32, ci, lsT, mcT, k, xt, dt, st, res);                                  \
    } while (0)

/* Rows n0..n1 of the output for every activation row: one decoded tile, then LC_GM rows at a time. */
static void LC_FN(gemm_rows)(int type, const uint8_t *w, int64_t n0, int64_t n1, int64_t k, int64_t row_bytes,
                             const int8_t *xq, const float *xd, const float *xs, int64_t t, void *out,
                             int out_bf16, int64_t ldo, uint8_t *c, float *ls, float *mc) {
    /* Scratch from lc_scratch(2 * LC_GN * k): c holds the interleaved tile then the decoded rows; ls one
       row's lane scales, every row's scale per 16, lsT and mcT; mc the rows' offsets per 16. */
    uint8_t *ci = c, *crows = c + LC_GN * k;
    float *s16 = ls + k / 4, *lsT = s16 + LC_GN * k / 16, *mcT = lsT + LC_GN * k / 16;
    LC_FN(gemm_tile)(type, w, n0, n1, k, row_bytes, ci, lsT, mcT, crows, ls, s16, mc);
    const int step = lc_scales_per16(type) ? 16 : 32; /* values per float conversion */
    float res[LC_GM][LC_GN];
    for (int64_t t0 = 0; t0 < t; t0 += LC_GM) {
        int mr = (int)(t - t0 < LC_GM ? t - t0 : LC_GM);
        const int8_t *xt = xq + t0 * k;
        const float *dt = xd + t0 * (k / 4), *st = xs + t0 * LC_XS(k);
        switch (mr) {
        case 4: LC_GEMM_BLOCK(4); break;
        case 3: LC_GEMM_BLOCK(3); break;
        case 2: LC_GEMM_BLOCK(2); break;
        default: LC_GEMM_BLOCK(1); break;
        }
        for (int i = 0; i < mr; i++)
            for (int64_t j = 0; j < n1 - n0; j++) lc_store(out, out_bf16, (t0 + i) * ldo + n0 + j, res[i][j]);
    }
}
