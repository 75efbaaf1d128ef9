/* Many activation rows on AVX-512 VNNI (prefill, batched decode): a tile of LC_GN weight rows is decoded
once into an interleaved form where one 64-byte load holds 4 consecutive codes of 16 output columns, so
each vpdpbusd against one broadcast activation group adds 4 products to 16 outputs at once. Integer sums
are converted to float once per 32 values (16 for Q6_K, whose scales change every 16), not per 4 as in
a row-by-row dot product: about twice the products per instruction of `micro`. Included by lc_impl.h. */

#define LC_GN 32 /* weight rows per tile: two zmm of output columns */
#define LC_GM 4  /* activation rows per register block */

/* Rows n0..n1 of `w` into ci[g][column][4] (128 bytes per 4-value group g), lsT[p][column] and
   mcT[p][column] (scale and offset per 16 values p). The rows are decoded one after another, then
   gathered column-wise: scattering them would store into a different cache line every 4 bytes. Columns
   past n1 are zero and never stored. */
static void LC_FN(gemm_tile)(int type, const uint8_t *w, int64_t n0, int64_t n1, int64_t k, int64_t row_bytes,
                             uint8_t *ci, float *lsT, float *mcT, uint8_t *crows, float *lsrows, float *mcrows) {
    for (int j = 0; j < LC_GN; j++) {
        if (n0 + j < n1) {
            LC_FN(decode_row)(type, w + (n0 + j) * row_bytes, k, crows + j * k, lsrows + j * (k / 4),
                              mcrows + j * (k / 16));
        } else {
            memset(crows + j * k, 0, (size_t)k);
            memset(lsrows + j * (k / 4), 0, sizeof(float) * (size_t)(k / 4));
            memset(mcrows + j * (k / 16), 0, sizeof(float) * (size_t)(k / 16));
        }
    }
    const __m512i lane = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    for (int h = 0; h < LC_GN / 16; h++) {
        __m512i col = _mm512_add_epi32(lane, _mm512_set1_epi32(16 * h));
        __m512i ic = _mm512_mullo_epi32(col, _mm512_set1_epi32((int)k));
        __m512i il = _mm512_mullo_epi32(col, _mm512_set1_epi32((int)(k / 4)));
        __m512i im = _mm512_mullo_epi32(col, _mm512_set1_epi32((int)(k / 16)));
        for (int64_t g = 0; g < k / 4; g++)
            _mm512_storeu_si512((void *)(ci + (g * LC_GN + 16 * h) * 4),
                                _mm512_i32gather_epi32(ic, (const void *)(crows + 4 * g), 1));
        for (int64_t p = 0; p < k / 16; p++) {
            _mm512_storeu_ps(lsT + p * LC_GN + 16 * h, _mm512_i32gather_ps(il, (const void *)(lsrows + 4 * p), 4));
            _mm512_storeu_ps(mcT + p * LC_GN + 16 * h, _mm512_i32gather_ps(im, (const void *)(mcrows + p), 4));
        }
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
    /* Scratch from lc_scratch(2 * LC_GN * k): c holds the interleaved tile then the decoded rows, ls the
       rows' lane scales then lsT and mcT, mc the rows' offsets. */
    uint8_t *ci = c, *crows = c + LC_GN * k;
    float *lsT = ls + LC_GN * k / 4, *mcT = lsT + LC_GN * k / 16;
    LC_FN(gemm_tile)(type, w, n0, n1, k, row_bytes, ci, lsT, mcT, crows, ls, mc);
    const int step = type == LC_Q6_K ? 16 : 32;
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
