/* Many-row steps (prefill, batches) on i-quant, ternary and MXFP4 blocks: each tile of 16 weight rows is
decoded once per call into int8 codes and float scales laid out as an x16 panel (lc_x16_layout.h: a
64-byte group holds 4 consecutive codes of 16 rows), then every activation row runs over it.

Why: lc_iquants.h's row kernel decodes a weight row again for every 4 activation rows (grid lookups,
sign flips) and pays a float conversion per 32 values per (row, activation row) pair; here the decode is
paid once for all rows and one integer instruction adds 4 values into 16 outputs, as the K-quants' x16
kernels do. Codes and scales are lc_iq_dec's (weight = scale * code, exact), so results differ from the
row kernel only in float32 summation order.

Panel: codes[k / 4][64] then scales[k / 16][16] (float, one per 16 values of each row; the types with one
scale per 32 store it twice); each thread's buffer holds two (40 * k bytes: AVX-512 runs panel pairs).
AVX-512 VNNI stores codes + 128 (vpdpbusd
reads unsigned bytes; the 128 * activation sum comes back out through the chain's start value), AVX2 the
codes + 64 where they fit (lc_iqg_small, the same correction) and else the signed codes (|code| times the
activation with the code's sign), portable C the signed codes. Included
once per ISA (LC_FN) after lc_iquants.h; the AVX-512 variant after lc_x16_avx512.h. */

#ifndef LC_IQG_COMMON
#define LC_IQG_COMMON
/* Steps of at least this many rows take the panel path (fewer: the row kernel, which decodes IQ4 in
   registers and needs no panel). x86, 8192x2048, one thread, ms, 5 rows by the row kernel against 8 by the
   panel: avx512vnni IQ4_XS 1.17 / 1.06, IQ3_XXS 3.02 / 1.64, IQ2_S 2.71 / 2.10, IQ3_S 3.33 / 2.65; avx2
   IQ4_XS 2.36 / 2.19, IQ3_XXS 3.56 / 2.44 (4 rows: the row kernel's IQ4_XS 0.83 and IQ2_S 1.74 win). NEON
   keeps 8 (not measured on hardware). */
#ifndef LC_IQG_MIN_ROWS
#if defined(__x86_64__) || defined(_M_X64)
#define LC_IQG_MIN_ROWS 5
#else
#define LC_IQG_MIN_ROWS 8
#endif
#endif

/* Types whose scale changes every 16 values (the others every 32). */
static inline int lc_iqg_per16(int type) {
    return type == LC_IQ2_XS || type == LC_IQ2_S || type == LC_IQ1_M || type == LC_NVFP4;
}

/* Types whose codes stay within +-63 (all but the IQ4 tables): AVX2 stores them + 64, so maddubs multiplies
   them unsigned against the signed activations directly (pair sums <= 2 * 127 * 127 cannot saturate). */
static inline int lc_iqg_small(int type) { return type != LC_IQ4_NL && type != LC_IQ4_XS; }

/* The calling thread's panel buffer (lc_grow). */
LC_SCRATCH(lc_iqg_buf);

/* 32 decoded values v and their lane scales ls of weight row c (0..15), sub-block s, into the panel (the
   portable and NEON panels; x86 transposes 8 rows at once, iqg_put8). */
static inline void lc_iqg_put(const int8_t *v, const float *ls, int c, int64_t s, uint8_t *codes, float *scales) {
    for (int g = 0; g < 8; g++) memcpy(codes + (8 * s + g) * 64 + 4 * c, v + 4 * g, 4);
    scales[(2 * s) * 16 + c] = ls[0];
    scales[(2 * s + 1) * 16 + c] = ls[4];
}
#endif /* LC_IQG_COMMON */

#if LC_ISA == LC_ISA_AVX2 || LC_ISA == LC_ISA_AVX512VNNI
/* Sub-block j of 8 weight rows (v[r][j]: 32 codes of row r, 8 four-byte pieces) into the panel's groups 8 s ..
   8 s + 7 at rows 8 h .. 8 h + 7: an 8 x 8 transpose of the pieces (unpacks, then 128-bit halves), one
   32-byte store per group instead of 64 four-byte ones. */
static inline void LC_FN(iqg_put8)(const __m256i (*v)[8], int j, int64_t s, int h, uint8_t *codes) {
    __m256i t[8], u[8];
    for (int r = 0; r < 8; r += 2) { /* rows r, r + 1: pieces 0 1 | 4 5 and 2 3 | 6 7, interleaved */
        t[r] = _mm256_unpacklo_epi32(v[r][j], v[r + 1][j]);
        t[r + 1] = _mm256_unpackhi_epi32(v[r][j], v[r + 1][j]);
    }
    for (int r = 0; r < 8; r += 4) { /* rows r .. r + 3: u[r + g] holds piece g | piece g + 4 */
        u[r] = _mm256_unpacklo_epi64(t[r], t[r + 2]);
        u[r + 1] = _mm256_unpackhi_epi64(t[r], t[r + 2]);
        u[r + 2] = _mm256_unpacklo_epi64(t[r + 1], t[r + 3]);
        u[r + 3] = _mm256_unpackhi_epi64(t[r + 1], t[r + 3]);
    }
    uint8_t *p = codes + 8 * s * 64 + 32 * h;
    for (int g = 0; g < 4; g++) {
        _mm256_storeu_si256((__m256i *)(p + g * 64), _mm256_permute2x128_si256(u[g], u[g + 4], 0x20));
        _mm256_storeu_si256((__m256i *)(p + (g + 4) * 64), _mm256_permute2x128_si256(u[g], u[g + 4], 0x31));
    }
}

/* Rows r0 .. r0 + 15 of the weights into the panel (rows past n: zero codes and scales); `type` a literal
   (iqg_panel below), so the decode inlines without a dispatch per sub-block. A block (8 sub-blocks) of 8
   rows at a time decodes in registers into v, then each sub-block's codes go in by iqg_put8; the block's
   groups (4 KiB, in L1) fill before the next block's, where a row at a time passed over the whole panel
   (16 k bytes, 128 KiB at k = 8192) once per row. AVX-512 stores the codes + 128, AVX2 the small types'
   + 64 (the top of this file). */
static inline __attribute__((always_inline)) void LC_FN(iqg_panel_t)(const int type, const uint8_t *w, int64_t n,
                                                                      int64_t r0, int64_t k, int64_t row_bytes,
                                                                      uint8_t *codes, float *scales) {
#if LC_ISA == LC_ISA_AVX512VNNI /* added to every code (+128 mod 256: the top bit flipped) */
    const __m256i bias = _mm256_set1_epi8((char)0x80);
#else
    const __m256i bias = _mm256_set1_epi8(lc_iqg_small(type) ? 64 : 0);
#endif
    __m256i v[8][8];
    float ls[8];
    const int64_t subs = k / 32;
    for (int64_t s0 = 0; s0 < subs; s0 += 8) {
        const int m = subs - s0 < 8 ? (int)(subs - s0) : 8; /* 8 but for IQ4_NL / MXFP4 rows */
        for (int h = 0; h < 2; h++) {
            for (int r = 0; r < 8; r++) {
                const int c = 8 * h + r;
                const uint8_t *row = w + (r0 + c) * row_bytes;
                if (r0 + c >= n) {
                    for (int j = 0; j < m; j++) {
                        v[r][j] = bias; /* code 0 */
                        scales[(2 * (s0 + j)) * 16 + c] = scales[(2 * (s0 + j) + 1) * 16 + c] = 0.0f;
                    }
                } else if (type == LC_IQ4_XS) { /* the block's 8 scales from vector code at once */
                    const uint8_t *b = row + 136 * (s0 / 8);
                    _mm256_storeu_ps(ls, LC_FN(iq4xs_scales)(b));
                    for (int j = 0; j < 8; j++) {
                        v[r][j] = _mm256_add_epi8(LC_FN(iq4_values)(b + 8 + 16 * j, lc_iq4nl_values), bias);
                        scales[(2 * (s0 + j)) * 16 + c] = scales[(2 * (s0 + j) + 1) * 16 + c] = ls[j];
                    }
                } else if (type == LC_IQ3_XXS) { /* the block's sign words and scales in vector code (as iq3_brow) */
                    const uint8_t *b = row + 98 * (s0 / 8);
                    const __m256i aux = _mm256_loadu_si256((const __m256i *)(b + 66));
                    uint32_t signs[8], unused;
                    LC_FN(iq3xxs_signs)(aux, signs);
                    const __m256 half = _mm256_set1_ps(0.5f);
                    __m256 sc = _mm256_add_ps(half, _mm256_cvtepi32_ps(_mm256_srli_epi32(aux, 28)));
                    _mm256_storeu_ps(ls, _mm256_mul_ps(_mm256_mul_ps(_mm256_set1_ps(_cvtsh_ss(lc_u16(b))), sc), half));
                    for (int j = 0; j < 8; j++) {
                        LC_FN(iq_gsub)(LC_IQ3_XXS, b, j, &v[r][j], &unused);
                        v[r][j] = _mm256_add_epi8(LC_FN(iq_flip)(v[r][j], signs[j]), bias);
                        scales[(2 * (s0 + j)) * 16 + c] = scales[(2 * (s0 + j) + 1) * 16 + c] = ls[j];
                    }
                } else {
                    for (int j = 0; j < m; j++) {
                        __m256 lv;
                        LC_FN(iq_sub)(type, row, s0 + j, &v[r][j], &lv); /* IQ4 and MXFP4 in registers */
                        v[r][j] = _mm256_add_epi8(v[r][j], bias);
                        _mm256_storeu_ps(ls, lv);
                        scales[(2 * (s0 + j)) * 16 + c] = ls[0];
                        scales[(2 * (s0 + j) + 1) * 16 + c] = ls[4];
                    }
                }
            }
            for (int j = 0; j < m; j++) LC_FN(iqg_put8)((const __m256i(*)[8])v, j, s0 + j, h, codes);
        }
    }
}
#else
/* Rows r0 .. r0 + 15 of the weights into the panel (rows past n: zero codes and scales), a row at a time. */
static inline __attribute__((always_inline)) void LC_FN(iqg_panel_t)(const int type, const uint8_t *w, int64_t n,
                                                                      int64_t r0, int64_t k, int64_t row_bytes,
                                                                      uint8_t *codes, float *scales) {
    int8_t v[32];
    float ls[8];
    for (int c = 0; c < 16; c++) {
        const uint8_t *row = w + (r0 + c) * row_bytes;
        for (int64_t s = 0; s < k / 32; s++) {
            if (r0 + c >= n) {
                memset(v, 0, sizeof(v));
                for (int l = 0; l < 8; l++) ls[l] = 0.0f;
            } else {
#if defined(__aarch64__) && defined(__ARM_NEON)
                LC_FN(iqn_dec)(type, row, s, v, ls); /* lc_iq_neon.h: in registers */
#else
                lc_iq_dec_row(type, row, s, v, ls);
#endif
            }
            lc_iqg_put(v, ls, c, s, codes, scales);
        }
    }
}
#endif

#define LC_IQG_PANEL(T) LC_FN(iqg_panel_t)(T, w, n, r0, k, row_bytes, codes, scales)
static void LC_FN(iqg_panel)(int type, const uint8_t *w, int64_t n, int64_t r0, int64_t k, int64_t row_bytes,
                             uint8_t *codes, float *scales) {
    switch (type) {
    case LC_IQ4_NL: LC_IQG_PANEL(LC_IQ4_NL); break;
    case LC_IQ4_XS: LC_IQG_PANEL(LC_IQ4_XS); break;
    case LC_MXFP4: LC_IQG_PANEL(LC_MXFP4); break;
    case LC_NVFP4: LC_IQG_PANEL(LC_NVFP4); break;
    case LC_Q1_0: LC_IQG_PANEL(LC_Q1_0); break;
    case LC_Q2_0: LC_IQG_PANEL(LC_Q2_0); break;
    case LC_IQ2_XXS: LC_IQG_PANEL(LC_IQ2_XXS); break;
    case LC_IQ2_XS: LC_IQG_PANEL(LC_IQ2_XS); break;
    case LC_IQ2_S: LC_IQG_PANEL(LC_IQ2_S); break;
    case LC_IQ3_XXS: LC_IQG_PANEL(LC_IQ3_XXS); break;
    case LC_IQ3_S: LC_IQG_PANEL(LC_IQ3_S); break;
    case LC_IQ1_S: LC_IQG_PANEL(LC_IQ1_S); break;
    case LC_IQ1_M: LC_IQG_PANEL(LC_IQ1_M); break;
    case LC_TQ1_0: LC_IQG_PANEL(LC_TQ1_0); break;
    default: LC_IQG_PANEL(LC_TQ2_0); break;
    }
}
#undef LC_IQG_PANEL

#if LC_ISA == LC_ISA_AVX512VNNI
/* `mr` activation rows from t0 against one panel: per unit of `u` values (16 or 32: one scale), one int32
   chain per row starts at 128 x minus the activation sum, takes u / 4 vpdpbusd (4 broadcast activation
   bytes x 4 codes of 16 rows), and joins the row's float sums once, times scale x activation scale. */
static inline __attribute__((always_inline)) void LC_FN(iqg_tile)(const int mr, const int u, const uint8_t *codes,
                                                                  const float *scales, int64_t k,
                                                                  const lc_x16_sums *x, int64_t t0, void *out,
                                                                  int out_bf16, int64_t ldo, int64_t r0, int cols) {
    __m512 acc[8];
    for (int i = 0; i < mr; i++) acc[i] = _mm512_setzero_ps();
    const int32_t *ns = u == 16 ? x->ns16 : x->ns32;
    const int64_t units = k / u;
    for (int64_t h = 0; h < units; h++) {
        __m512i c[8];
        for (int i = 0; i < mr; i++) c[i] = _mm512_set1_epi32(ns[(t0 + i) * units + h] * 128);
        for (int g = 0; g < u / 4; g++) {
            __m512i cv = _mm512_loadu_si512((const void *)(codes + (h * (u / 4) + g) * 64));
            for (int i = 0; i < mr; i++) {
                int32_t xb;
                memcpy(&xb, x->xq + (t0 + i) * k + h * u + 4 * g, 4);
                c[i] = _mm512_dpbusd_epi32(c[i], cv, _mm512_set1_epi32(xb));
            }
        }
        __m512 sv = _mm512_loadu_ps(scales + h * (u / 16) * 16);
        for (int i = 0; i < mr; i++) {
            __m512 f = _mm512_mul_ps(sv, _mm512_set1_ps(x->dx32[(t0 + i) * (k / 32) + h * u / 32]));
            acc[i] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(c[i]), f, acc[i]);
        }
    }
    for (int i = 0; i < mr; i++) LC_FN(x16_store)(acc[i], out, out_bf16, (t0 + i) * ldo + r0, cols);
}
#define LC_IQG_MR2 6 /* iqg_tile2's rows: 12 int32 chains + 12 float sums in the 32 zmm registers */
/* As iqg_tile over two panels (32 weight rows) at once: each broadcast of 4 activation bytes feeds two
   vpdpbusd (one per panel), as the K-quants' x16 kernels pair their panels. 8B IQ4_XS 4096x4096, 512 rows,
   one thread: 514 -> 673 GFLOP/s (the same bits). */
static inline __attribute__((always_inline)) void LC_FN(iqg_tile2)(const int mr, const int u, const uint8_t *codes,
                                                                   const float *scales, int64_t k,
                                                                   const lc_x16_sums *x, int64_t t0, void *out,
                                                                   int out_bf16, int64_t ldo, int64_t r0, int cols,
                                                                   int cols2) {
    __m512 acc[LC_IQG_MR2][2];
    const uint8_t *codes2 = codes + 16 * k;
    const float *scales2 = scales + k;
    for (int i = 0; i < mr; i++) acc[i][0] = acc[i][1] = _mm512_setzero_ps();
    const int32_t *ns = u == 16 ? x->ns16 : x->ns32;
    const int64_t units = k / u;
    for (int64_t h = 0; h < units; h++) {
        __m512i c[LC_IQG_MR2][2];
        for (int i = 0; i < mr; i++) c[i][0] = c[i][1] = _mm512_set1_epi32(ns[(t0 + i) * units + h] * 128);
        for (int g = 0; g < u / 4; g++) {
            __m512i cv0 = _mm512_loadu_si512((const void *)(codes + (h * (u / 4) + g) * 64));
            __m512i cv1 = _mm512_loadu_si512((const void *)(codes2 + (h * (u / 4) + g) * 64));
            for (int i = 0; i < mr; i++) {
                int32_t xb;
                memcpy(&xb, x->xq + (t0 + i) * k + h * u + 4 * g, 4);
                __m512i xv = _mm512_set1_epi32(xb);
                c[i][0] = _mm512_dpbusd_epi32(c[i][0], cv0, xv);
                c[i][1] = _mm512_dpbusd_epi32(c[i][1], cv1, xv);
            }
        }
        __m512 sv0 = _mm512_loadu_ps(scales + h * (u / 16) * 16), sv1 = _mm512_loadu_ps(scales2 + h * (u / 16) * 16);
        for (int i = 0; i < mr; i++) {
            __m512 d = _mm512_set1_ps(x->dx32[(t0 + i) * (k / 32) + h * u / 32]);
            acc[i][0] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(c[i][0]), _mm512_mul_ps(sv0, d), acc[i][0]);
            acc[i][1] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(c[i][1]), _mm512_mul_ps(sv1, d), acc[i][1]);
        }
    }
    for (int i = 0; i < mr; i++) {
        LC_FN(x16_store)(acc[i][0], out, out_bf16, (t0 + i) * ldo + r0, cols);
        if (cols2 > 0) LC_FN(x16_store)(acc[i][1], out, out_bf16, (t0 + i) * ldo + r0 + 16, cols2);
    }
}
#define LC_IQG_MR 8
#elif LC_ISA == LC_ISA_AVX2
/* As above in two 8-row halves of 256 bits; codes are signed, multiplied as |code| x (activation with the
   code's sign) (|both| <= 127: the int16 pair sums of maddubs cannot saturate). */
static inline __attribute__((always_inline)) void LC_FN(iqg_tile)(const int mr, const int u, const int small,
                                                                  const uint8_t *codes, const float *scales,
                                                                  int64_t k, const int8_t *xq, const float *xd,
                                                                  const lc_x16_sums *x, int64_t t0, void *out,
                                                                  int out_bf16, int64_t ldo, int64_t r0, int cols) {
    const __m256i ones = _mm256_set1_epi16(1);
    __m256 acc[4][2];
    for (int i = 0; i < mr; i++) acc[i][0] = acc[i][1] = _mm256_setzero_ps();
    const int64_t units = k / u;
    const int32_t *ns = u == 16 ? x->ns16 : x->ns32;
    for (int64_t h = 0; h < units; h++) {
        __m256i c[4][2];
        for (int i = 0; i < mr; i++) /* small: codes + 64, so the chain starts at 64 x minus the sum */
            c[i][0] = c[i][1] = small ? _mm256_set1_epi32(ns[(t0 + i) * units + h] * 64) : _mm256_setzero_si256();
        for (int g = 0; g < u / 4; g++) {
            const uint8_t *p = codes + (h * (u / 4) + g) * 64;
            __m256i v0 = _mm256_loadu_si256((const __m256i *)p), v1 = _mm256_loadu_si256((const __m256i *)(p + 32));
            __m256i a0 = small ? v0 : _mm256_abs_epi8(v0), a1 = small ? v1 : _mm256_abs_epi8(v1);
            for (int i = 0; i < mr; i++) {
                int32_t xb;
                memcpy(&xb, xq + (t0 + i) * k + h * u + 4 * g, 4);
                __m256i xv = _mm256_set1_epi32(xb);
                __m256i p0 = _mm256_maddubs_epi16(a0, small ? xv : _mm256_sign_epi8(xv, v0));
                __m256i p1 = _mm256_maddubs_epi16(a1, small ? xv : _mm256_sign_epi8(xv, v1));
                c[i][0] = _mm256_add_epi32(c[i][0], _mm256_madd_epi16(p0, ones));
                c[i][1] = _mm256_add_epi32(c[i][1], _mm256_madd_epi16(p1, ones));
            }
        }
        const float *sp = scales + h * (u / 16) * 16;
        __m256 s0 = _mm256_loadu_ps(sp), s1 = _mm256_loadu_ps(sp + 8);
        for (int i = 0; i < mr; i++) {
            __m256 d = _mm256_set1_ps(xd[(t0 + i) * (k / 4) + h * u / 4]);
            acc[i][0] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(c[i][0]), _mm256_mul_ps(s0, d), acc[i][0]);
            acc[i][1] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(c[i][1]), _mm256_mul_ps(s1, d), acc[i][1]);
        }
    }
    for (int i = 0; i < mr; i++) {
        float v[16];
        _mm256_storeu_ps(v, acc[i][0]);
        _mm256_storeu_ps(v + 8, acc[i][1]);
        if (!out_bf16 && cols == 16) memcpy((float *)out + (t0 + i) * ldo + r0, v, sizeof(v));
        else
            for (int c = 0; c < cols; c++) lc_store(out, out_bf16, (t0 + i) * ldo + r0 + c, v[c]);
    }
}
#define LC_IQG_MR 4
#elif defined(__aarch64__) && defined(__ARM_NEON) /* the tile: lc_iq_neon.h (sdot, or smull + sadalp) */
#define LC_IQG_MR 2
#else
/* Plain C on the same panel: the loops over the 16 rows of a group vectorize where the compiler can. */
static void LC_FN(iqg_tile)(const int mr, const int u, const uint8_t *codes, const float *scales, int64_t k,
                            const int8_t *xq, const float *xd, int64_t t0, void *out, int out_bf16, int64_t ldo,
                            int64_t r0, int cols) {
    for (int i = 0; i < mr; i++) {
        float acc[16] = {0};
        const int8_t *x = xq + (t0 + i) * k;
        for (int64_t h = 0; h < k / u; h++) {
            int32_t sum[16] = {0};
            for (int g = 0; g < u / 4; g++) {
                const int8_t *p = (const int8_t *)codes + (h * (u / 4) + g) * 64;
                const int8_t *xg = x + h * u + 4 * g;
                for (int c = 0; c < 16; c++)
                    for (int b = 0; b < 4; b++) sum[c] += (int32_t)p[4 * c + b] * (int32_t)xg[b];
            }
            const float *sp = scales + h * (u / 16) * 16;
            float d = xd[(t0 + i) * (k / 4) + h * u / 4];
            for (int c = 0; c < 16; c++) acc[c] += (float)sum[c] * (sp[c] * d);
        }
        for (int c = 0; c < cols; c++) lc_store(out, out_bf16, (t0 + i) * ldo + r0 + c, acc[c]);
    }
}
#define LC_IQG_MR 4
#endif

#if LC_ISA == LC_ISA_AVX512VNNI
#define LC_IQG_ARGS(U) U, codes, scales, k, x
#else /* portable (AVX2 calls its tile in LC_IQG_CALL) */
#define LC_IQG_ARGS(U) U, codes, scales, k, xq, xd
#endif
#if LC_ISA == LC_ISA_AVX2 /* `small` a literal too, so each variant's inner loop has no branch */
#define LC_IQG_CALL(M, U)                                                                                        \
    if (lc_iqg_small(type)) LC_FN(iqg_tile)(M, U, 1, codes, scales, k, xq, xd, x, t0, out, out_bf16, ldo, r0, cols); \
    else LC_FN(iqg_tile)(M, U, 0, codes, scales, k, xq, xd, x, t0, out, out_bf16, ldo, r0, cols);
#else
#define LC_IQG_CALL(M, U) LC_FN(iqg_tile)(M, LC_IQG_ARGS(U), t0, out, out_bf16, ldo, r0, cols);
#endif
#define LC_IQG_TILE(M)                                                                                           \
    if (u == 16) {                                                                                               \
        LC_IQG_CALL(M, 16)                                                                                       \
    } else {                                                                                                     \
        LC_IQG_CALL(M, 32)                                                                                       \
    }                                                                                                            \
    break;

/* out[i, j] (row stride ldo) = activation row i . weight row j for t activation rows (lc_quantize's xq/xd;
   `x`, their x16 summaries, read by AVX-512 and AVX2) and n weight rows of i-quant blocks, row_bytes apart:
   panels of 16 weight rows split over threads. LC_ENOMEM when a thread's panel buffer cannot grow. */
static int LC_FN(iq_gemm)(int type, const uint8_t *w, int64_t n, int64_t k, int64_t row_bytes, const int8_t *xq,
                          const float *xd, const lc_x16_sums *x, int64_t t, void *out, int out_bf16, int64_t ldo,
                          int nth) {
    (void)x;
    const int u = lc_iqg_per16(type) ? 16 : 32;
    const int64_t panels = (n + 15) / 16;
    int failed = 0;
#ifdef _OPENMP
#pragma omp parallel num_threads(nth) reduction(| : failed)
#endif
    {
        uint8_t *codes = (uint8_t *)lc_grow(&lc_iqg_buf, &lc_iqg_buf_size, (size_t)k * 40 + 64);
        /* two panels: codes, codes + 16 k, then their scales */
        float *scales = codes ? (float *)(codes + 32 * k) : NULL;
        failed |= codes == NULL;
#ifdef _OPENMP
#pragma omp for schedule(static)
#endif
#if LC_ISA == LC_ISA_AVX512VNNI /* panel pairs (iqg_tile2) */
        for (int64_t pp = 0; pp < (panels + 1) / 2; pp++) {
            if (!codes) continue;
            int64_t r0 = 32 * pp;
            int cols = n - r0 < 16 ? (int)(n - r0) : 16;
            int cols2 = n - r0 - 16 < 16 ? (int)(n - r0 - 16) : 16;
            LC_FN(iqg_panel)(type, w, n, r0, k, row_bytes, codes, scales);
            LC_FN(iqg_panel)(type, w, n, r0 + 16, k, row_bytes, codes + 16 * k, scales + k);
            for (int64_t t0 = 0; t0 < t; t0 += LC_IQG_MR2) {
                switch (t - t0 < LC_IQG_MR2 ? (int)(t - t0) : LC_IQG_MR2) {
#define LC_IQG_T2(M)                                                                                             \
    if (u == 16) LC_FN(iqg_tile2)(M, 16, codes, scales, k, x, t0, out, out_bf16, ldo, r0, cols, cols2);          \
    else LC_FN(iqg_tile2)(M, 32, codes, scales, k, x, t0, out, out_bf16, ldo, r0, cols, cols2);                 \
    break;
                case 1: LC_IQG_T2(1)
                case 2: LC_IQG_T2(2)
                case 3: LC_IQG_T2(3)
#if LC_IQG_MR2 > 4
                case 4: LC_IQG_T2(4)
                case 5: LC_IQG_T2(5)
                default: LC_IQG_T2(6)
#else
                default: LC_IQG_T2(4)
#endif
#undef LC_IQG_T2
                }
            }
        }
#else
        for (int64_t p = 0; p < panels; p++) {
            if (!codes) continue;
            int64_t r0 = 16 * p;
            int cols = n - r0 < 16 ? (int)(n - r0) : 16;
            LC_FN(iqg_panel)(type, w, n, r0, k, row_bytes, codes, scales);
            for (int64_t t0 = 0; t0 < t; t0 += LC_IQG_MR) {
                switch (t - t0 < LC_IQG_MR ? (int)(t - t0) : LC_IQG_MR) {
                case 1: LC_IQG_TILE(1)
                case 2: LC_IQG_TILE(2)
                case 3: LC_IQG_TILE(3)
#if LC_IQG_MR == 8
                case 4: LC_IQG_TILE(4)
                case 5: LC_IQG_TILE(5)
                case 6: LC_IQG_TILE(6)
                case 7: LC_IQG_TILE(7)
                default: LC_IQG_TILE(8)
#else
                default: LC_IQG_TILE(4)
#endif
                }
            }
        }
#endif
    }
    return failed ? LC_ENOMEM : LC_OK;
}
#undef LC_IQG_TILE
#undef LC_IQG_CALL
#undef LC_IQG_ARGS
#undef LC_IQG_MR
