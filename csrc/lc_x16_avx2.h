/* Matmul on x16 panels (lc_x16_layout.h) with AVX2: each 64-byte chunk of codes is two 8-column halves,
one ymm each. vpmaddubsw multiplies a half's unsigned codes by 4 broadcast activation bytes into int16
pair sums, which add up in int16 for a whole 32-value unit of 4-bit codes (at most 8 x 2 x 15 x 127 =
30480) or two groups of Q6_K's 6-bit ones, then widen once through vpmaddwd. Q8_0 takes its codes back to
signed and multiplies |q| by the activations carrying q's sign, so no pair sum saturates (2 x 128 x 127).
Half by half, LC_X16_MR2 activation rows per pass. Included by lc_kernels.c for the AVX2 variant. */

#define LC_X16_MR2 3
#ifndef LC_PF2 /* prefetch distance in bytes of the first half's pass (the second reads the panel from L2) */
#define LC_PF2 8192
#endif

/* Prefetch the lines of bytes [from, to) of a unit LC_PF2 ahead: the panels stream from memory once, and
   without it AVX2 one-row decode left the memory idle between the hardware prefetcher's page-bounded runs. */
static inline __attribute__((always_inline)) void LC_FN(x16h_ahead)(const uint8_t *u, int64_t from, int64_t to) {
    for (int64_t l = from & ~(int64_t)63; l < to; l += 64) _mm_prefetch((const char *)(u + l + LC_PF2), _MM_HINT_T0);
}

typedef lc_x16_sums LC_FN(xsum);

static inline __m256i LC_FN(x4)(const int8_t *x) {
    int32_t v;
    memcpy(&v, x, 4);
    return _mm256_set1_epi32(v);
}

static inline __m256 LC_FN(h8)(const uint8_t *p) { return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p)); }
static inline __m256 LC_FN(u8f8)(const uint8_t *p) {
    return _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)p)));
}
static inline __m256 LC_FN(i8f8)(const uint8_t *p) {
    return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)p)));
}

/* Group g's fifth bit (bit g of each byte of fv) moved to bit 4 and added to nibble codes nib: shifts of
   at most 4 within 16-bit lanes stay clean. */
static inline __attribute__((always_inline)) __m256i LC_FN(x16h_five)(__m256i nib, __m256i fv, const int g) {
    __m256i f = g <= 4 ? _mm256_slli_epi16(fv, 4 - g) : _mm256_srli_epi16(fv, g - 4);
    return _mm256_or_si256(nib, _mm256_and_si256(f, _mm256_set1_epi8(16)));
}

/* Half h of Q6_K's 16 values: low nibbles v0, v1 and the high-bit chunk hv as 4 code groups. */
static inline __attribute__((always_inline)) void LC_FN(x16h_sixes)(__m256i v0, __m256i v1, __m256i hv, __m256i *cg) {
    const __m256i low = _mm256_set1_epi8(15), top = _mm256_set1_epi8(0x30);
    cg[0] = _mm256_or_si256(_mm256_and_si256(v0, low), _mm256_and_si256(_mm256_slli_epi16(hv, 4), top));
    cg[1] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(v0, 4), low), _mm256_and_si256(_mm256_slli_epi16(hv, 2), top));
    cg[2] = _mm256_or_si256(_mm256_and_si256(v1, low), _mm256_and_si256(hv, top));
    cg[3] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(v1, 4), low), _mm256_and_si256(_mm256_srli_epi16(hv, 2), top));
}

/* Half hh of 32 Q3_K values: their low 2-bit chunk lv and the third bits fv (bit g: code group g of the
   32) as 4 code groups of 0..7. */
static inline __attribute__((always_inline)) void LC_FN(x16h_threes)(__m256i lv, __m256i fv, const int hh, __m256i *cg) {
    const __m256i two = _mm256_set1_epi8(3), four = _mm256_set1_epi8(4);
    for (int m = 0; m < 4; m++) {
        const int g = 4 * hh + m; /* bit g of fv to bit 2 */
        __m256i f = g <= 2 ? _mm256_slli_epi16(fv, 2 - g) : _mm256_srli_epi16(fv, g - 2);
        cg[m] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(lv, 2 * m), two), _mm256_and_si256(f, four));
    }
}

/* int16 pair sums of 32 nibble-coded values (half h of each chunk at q) for `mr` rows at column x0. */
static inline __attribute__((always_inline)) void LC_FN(x16h_nibbles)(const int mr, const uint8_t *q, int h, const int8_t *xq,
                                                                      int64_t k, int64_t x0, __m256i *a16) {
    const __m256i low = _mm256_set1_epi8(15);
    for (int j = 0; j < 4; j++) {
        __m256i v = _mm256_loadu_si256((const __m256i *)(q + 64 * j + 32 * h));
        __m256i lo = _mm256_and_si256(v, low), hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), low);
        for (int i = 0; i < mr; i++) {
            const int8_t *xr = xq + i * k + x0 + 8 * j;
            a16[i] = _mm256_add_epi16(a16[i], _mm256_maddubs_epi16(lo, LC_FN(x4)(xr)));
            a16[i] = _mm256_add_epi16(a16[i], _mm256_maddubs_epi16(hi, LC_FN(x4)(xr + 4)));
        }
    }
}

/* int16 pair sums of 32 5-bit values (Q5_0, Q5_1, Q5_K: nibble codes at q, their fifth bits at fifth; half h of each chunk)
   for `mr` rows at column x0, into a32: 5-bit codes widen to int32 every 4 code groups (4 x 2 x 31 x 127
   = 31496 fits int16, 8 groups would not). */
static inline __attribute__((always_inline)) void LC_FN(x16h_fives)(const int mr, const uint8_t *q, const uint8_t *fifth,
                                                                    int h, const int8_t *xq, int64_t k, int64_t x0,
                                                                    __m256i *a32) {
    const __m256i low = _mm256_set1_epi8(15), ones = _mm256_set1_epi16(1);
    const __m256i fv = _mm256_loadu_si256((const __m256i *)(fifth + 32 * h));
    for (int half = 0; half < 2; half++) {
        __m256i a16[LC_X16_MR2];
        for (int i = 0; i < mr; i++) a16[i] = _mm256_setzero_si256();
        for (int j = 2 * half; j < 2 * half + 2; j++) {
            __m256i v = _mm256_loadu_si256((const __m256i *)(q + 64 * j + 32 * h));
            __m256i lo = LC_FN(x16h_five)(_mm256_and_si256(v, low), fv, 2 * j);
            __m256i hi = LC_FN(x16h_five)(_mm256_and_si256(_mm256_srli_epi16(v, 4), low), fv, 2 * j + 1);
            for (int i = 0; i < mr; i++) {
                const int8_t *xr = xq + i * k + x0 + 8 * j;
                a16[i] = _mm256_add_epi16(a16[i], _mm256_maddubs_epi16(lo, LC_FN(x4)(xr)));
                a16[i] = _mm256_add_epi16(a16[i], _mm256_maddubs_epi16(hi, LC_FN(x4)(xr + 4)));
            }
        }
        for (int i = 0; i < mr; i++) a32[i] = _mm256_add_epi32(a32[i], _mm256_madd_epi16(a16[i], ones));
    }
}

/* Code groups 0..groups of the values from x0 on, half h, from codes expanded to bytes (x16h_expand:
   group g of values x0.. at xc + 16 x0 + 64 g), added into a32: the int16 pair sums widen every `widen`
   groups (8 for 4-bit codes, 4 for 5-bit, 2 for 6-bit: at most 30480, 31496, 32004). */
static inline __attribute__((always_inline)) void LC_FN(x16h_expanded)(const int mr, const int groups, const int widen,
                                                                       const uint8_t *xc, int h, const int8_t *xq, int64_t k,
                                                                       int64_t x0, __m256i *a32) {
    const __m256i ones = _mm256_set1_epi16(1);
    for (int g0 = 0; g0 < groups; g0 += widen) {
        __m256i a16[LC_X16_MR2];
        for (int i = 0; i < mr; i++) a16[i] = _mm256_setzero_si256();
        for (int g = g0; g < g0 + widen; g++) {
            __m256i cv = _mm256_loadu_si256((const __m256i *)(xc + 16 * x0 + 64 * g + 32 * h));
            for (int i = 0; i < mr; i++)
                a16[i] = _mm256_add_epi16(a16[i], _mm256_maddubs_epi16(cv, LC_FN(x4)(xq + i * k + x0 + 4 * g)));
        }
        for (int i = 0; i < mr; i++) a32[i] = _mm256_add_epi32(a32[i], _mm256_madd_epi16(a16[i], ones));
    }
}

/* The panel at p with its codes as x16h_panel reads them, written to xc as bytes: value v's group (v / 4)
   of 16 columns at xc + 16 v (lc_x16_expands' types: Q5_0, Q5_1, Q3_K, Q5_K, Q6_K). */
static void LC_FN(x16h_expand)(int type, const uint8_t *p, int64_t k, uint8_t *xc) {
    const int64_t ub = lc_x16_unit_bytes(type);
    const __m256i low = _mm256_set1_epi8(15);
    for (int64_t s = 0; s < k / 32; s++) {
        const uint8_t *q, *fifth, *u = p + (type >= LC_Q2_K ? (s / 8) * ub : s * ub);
        int j8 = (int)(s % 8);
        uint8_t *o = xc + 512 * s;
        if (type == LC_Q6_K) {
            const uint8_t *ql = u + LC_X16_Q6_QL(j8), *qh = u + LC_X16_Q6_QH(j8);
            for (int hh = 0; hh < 2; hh++)
                for (int h = 0; h < 2; h++) {
                    __m256i cg[4];
                    LC_FN(x16h_sixes)(_mm256_loadu_si256((const __m256i *)(ql + 128 * hh + 32 * h)),
                                      _mm256_loadu_si256((const __m256i *)(ql + 128 * hh + 64 + 32 * h)),
                                      _mm256_loadu_si256((const __m256i *)(qh + 64 * hh + 32 * h)), cg);
                    for (int g = 0; g < 4; g++) _mm256_storeu_si256((__m256i *)(o + 256 * hh + 64 * g + 32 * h), cg[g]);
                }
            continue;
        }
        if (type == LC_Q3_K) {
            for (int h = 0; h < 2; h++) {
                __m256i fv = _mm256_loadu_si256((const __m256i *)(u + LC_X16_Q3_QH(j8) + 32 * h)), cg[4];
                for (int hh = 0; hh < 2; hh++) {
                    LC_FN(x16h_threes)(_mm256_loadu_si256((const __m256i *)(u + LC_X16_Q3_QL(j8) + 64 * hh + 32 * h)), fv, hh, cg);
                    for (int g = 0; g < 4; g++) _mm256_storeu_si256((__m256i *)(o + 256 * hh + 64 * g + 32 * h), cg[g]);
                }
            }
            continue;
        }
        if (type == LC_Q5_K) q = u + LC_X16_Q5_QL(j8), fifth = u + LC_X16_Q5_QH(j8);
        else q = u + LC_X16_LEGACY_Q(type), fifth = q + 256; /* Q5_0, Q5_1 */
        for (int h = 0; h < 2; h++) {
            __m256i fv = _mm256_loadu_si256((const __m256i *)(fifth + 32 * h));
            for (int j = 0; j < 4; j++) {
                __m256i v = _mm256_loadu_si256((const __m256i *)(q + 64 * j + 32 * h));
                __m256i lo = LC_FN(x16h_five)(_mm256_and_si256(v, low), fv, 2 * j);
                __m256i hi = LC_FN(x16h_five)(_mm256_and_si256(_mm256_srli_epi16(v, 4), low), fv, 2 * j + 1);
                _mm256_storeu_si256((__m256i *)(o + 128 * j + 32 * h), lo);
                _mm256_storeu_si256((__m256i *)(o + 128 * j + 64 + 32 * h), hi);
            }
        }
    }
}

/* Half h (8 columns) of the panel at p against rows 0..mr of x: out[i] for those columns; with xc, the
   panel's codes from there (x16h_expand). */
static inline __attribute__((always_inline)) void LC_FN(x16h_panel)(const int type, const int mr, const uint8_t *p, int h,
                                                                    int64_t k, LC_FN(xsum) x, const uint8_t *xc, __m256 *out) {
    const int64_t k16 = k / 16, k32 = k / 32, ub = lc_x16_unit_bytes(type);
    const __m256i ones = _mm256_set1_epi16(1);
    __m256i a16[LC_X16_MR2], a32[LC_X16_MR2];
    for (int i = 0; i < mr; i++) out[i] = _mm256_setzero_ps();
    if (type == LC_Q4_0 || type == LC_Q4_1 || type == LC_Q5_0 || type == LC_Q5_1 || type == LC_Q8_0) {
        const int with_min = type == LC_Q4_1 || type == LC_Q5_1;
        for (int64_t s = 0; s < k32; s++) {
            const uint8_t *u = p + s * ub;
            if (h == 0 && !xc) LC_FN(x16h_ahead)(u, 0, ub);
            __m256 dv = LC_FN(h8)(u + 16 * h);
            for (int i = 0; i < mr; i++) {
                a16[i] = _mm256_setzero_si256();
                /* offsets -8d (Q4_0), -16d (Q5_0): start at that times the activation sum (Q8_0 runs on signed codes) */
                a32[i] = type == LC_Q4_0 || type == LC_Q5_0
                             ? _mm256_slli_epi32(_mm256_set1_epi32(x.ns32[i * k32 + s]), type == LC_Q4_0 ? 3 : 4)
                             : a16[i];
            }
            if (xc) {
                LC_FN(x16h_expanded)(mr, 8, type == LC_Q5_0 || type == LC_Q5_1 ? 4 : 8, xc, h, x.xq, k, 32 * s, a32);
            } else if (type == LC_Q8_0) {
                for (int g = 0; g < 8; g++) {
                    __m256i q = _mm256_xor_si256(_mm256_loadu_si256((const __m256i *)(u + 32 + 64 * g + 32 * h)),
                                                 _mm256_set1_epi8((char)0x80));
                    __m256i aq = _mm256_abs_epi8(q);
                    for (int i = 0; i < mr; i++) {
                        __m256i sx = _mm256_sign_epi8(LC_FN(x4)(x.xq + i * k + 32 * s + 4 * g), q);
                        a32[i] = _mm256_add_epi32(a32[i], _mm256_madd_epi16(_mm256_maddubs_epi16(aq, sx), ones));
                    }
                }
            } else if (type == LC_Q5_0 || type == LC_Q5_1) {
                const uint8_t *q = u + LC_X16_LEGACY_Q(type);
                LC_FN(x16h_fives)(mr, q, q + 256, h, x.xq, k, 32 * s, a32);
            } else {
                LC_FN(x16h_nibbles)(mr, u + LC_X16_LEGACY_Q(type), h, x.xq, k, 32 * s, a16);
                for (int i = 0; i < mr; i++) a32[i] = _mm256_add_epi32(a32[i], _mm256_madd_epi16(a16[i], ones));
            }
            for (int i = 0; i < mr; i++)
                out[i] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(a32[i]), _mm256_mul_ps(dv, _mm256_set1_ps(x.dx32[i * k32 + s])), out[i]);
            if (with_min) {
                __m256 mv = LC_FN(h8)(u + 32 + 16 * h);
                for (int i = 0; i < mr; i++) out[i] = _mm256_fmadd_ps(mv, _mm256_set1_ps(x.fs32[i * k32 + s]), out[i]);
            }
        }
    }
    const int64_t units256 = type >= LC_Q2_K ? k / 256 : 0;
    for (int64_t s8 = 0; s8 < units256; s8++) {
        const uint8_t *u = p + s8 * ub;
        __m256 dv = LC_FN(h8)(u + 16 * h);
        if (h == 0 && !xc) LC_FN(x16h_ahead)(u, 0, ub / 8);
        if (type == LC_Q4_K || type == LC_Q5_K) {
            __m256 mn = LC_FN(h8)(u + 32 + 16 * h);
            for (int j = 0; j < 8; j++) {
                int64_t s = 8 * s8 + j;
                if (h == 0 && !xc && j < 7) LC_FN(x16h_ahead)(u, (j + 1) * ub / 8, (j + 2) * ub / 8);
                for (int i = 0; i < mr; i++) a16[i] = a32[i] = _mm256_setzero_si256();
                if (xc) {
                    LC_FN(x16h_expanded)(mr, 8, type == LC_Q5_K ? 4 : 8, xc, h, x.xq, k, 32 * s, a32);
                } else if (type == LC_Q4_K) {
                    LC_FN(x16h_nibbles)(mr, u + 320 + 256 * j, h, x.xq, k, 32 * s, a16);
                    for (int i = 0; i < mr; i++) a32[i] = _mm256_madd_epi16(a16[i], ones);
                } else {
                    LC_FN(x16h_fives)(mr, u + LC_X16_Q5_QL(j), u + LC_X16_Q5_QH(j), h, x.xq, k, 32 * s, a32);
                }
                __m256 sv = _mm256_mul_ps(dv, LC_FN(u8f8)(u + 64 + 16 * j + 8 * h));
                __m256 mv = _mm256_mul_ps(mn, LC_FN(u8f8)(u + 192 + 16 * j + 8 * h)); /* subtracted */
                for (int i = 0; i < mr; i++) {
                    __m256 f = _mm256_mul_ps(sv, _mm256_set1_ps(x.dx32[i * k32 + s]));
                    out[i] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(a32[i]), f, out[i]);
                    out[i] = _mm256_fnmadd_ps(mv, _mm256_set1_ps(x.fs32[i * k32 + s]), out[i]);
                }
            }
        } else if (type == LC_Q2_K) { /* a scale and a min per 16 values: d sc sum(q x) - dmin m sum(x) */
            __m256 mn = LC_FN(h8)(u + 32 + 16 * h);
            for (int j = 0; j < 8; j++) {
                int64_t s = 8 * s8 + j;
                if (h == 0 && !xc && j < 7) LC_FN(x16h_ahead)(u, (j + 1) * ub / 8, (j + 2) * ub / 8);
                for (int hh = 0; hh < 2; hh++) {
                    int64_t x0 = 32 * s + 16 * hh;
                    __m256i lv = _mm256_loadu_si256((const __m256i *)(u + LC_X16_Q2_Q(j) + 64 * hh + 32 * h));
                    __m256i sm = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(u + LC_X16_Q2_SM(j) + 16 * hh + 8 * h)));
                    __m256 sv = _mm256_mul_ps(dv, _mm256_cvtepi32_ps(_mm256_and_si256(sm, _mm256_set1_epi32(15))));
                    __m256 mv = _mm256_mul_ps(mn, _mm256_cvtepi32_ps(_mm256_srli_epi32(sm, 4)));
                    for (int i = 0; i < mr; i++) a16[i] = _mm256_setzero_si256(); /* 4 groups: at most 3048 */
                    for (int g = 0; g < 4; g++) {
                        __m256i cv = _mm256_and_si256(_mm256_srli_epi16(lv, 2 * g), _mm256_set1_epi8(3));
                        for (int i = 0; i < mr; i++)
                            a16[i] = _mm256_add_epi16(a16[i], _mm256_maddubs_epi16(cv, LC_FN(x4)(x.xq + i * k + x0 + 4 * g)));
                    }
                    for (int i = 0; i < mr; i++) { /* ns16 is minus the code sum: the min term added */
                        float dx = x.dx32[i * k32 + s];
                        out[i] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_madd_epi16(a16[i], ones)), _mm256_mul_ps(sv, _mm256_set1_ps(dx)), out[i]);
                        out[i] = _mm256_fmadd_ps(mv, _mm256_set1_ps((float)x.ns16[i * k16 + 2 * s + hh] * dx), out[i]);
                    }
                }
            }
        } else { /* LC_Q3_K, LC_Q6_K: one scale per 16 values, offsets -4 and -32 x scale; pair sums of two
                    6-bit groups still fit int16 */
            const int q3 = type == LC_Q3_K;
            for (int j = 0; j < 8; j++) {
                const uint8_t *ql = u + (q3 ? LC_X16_Q3_QL(j) : LC_X16_Q6_QL(j)), *qh = u + (q3 ? LC_X16_Q3_QH(j) : LC_X16_Q6_QH(j));
                int64_t s = 8 * s8 + j;
                if (h == 0 && !xc && j < 7) LC_FN(x16h_ahead)(u, (j + 1) * ub / 8, (j + 2) * ub / 8);
                for (int hh = 0; hh < 2; hh++) {
                    int64_t x0 = 32 * s + 16 * hh;
                    __m256 sv = _mm256_mul_ps(dv, LC_FN(i8f8)(u + (q3 ? LC_X16_Q3_SC(j) : LC_X16_Q6_SC(j)) + 16 * hh + 8 * h));
                    for (int i = 0; i < mr; i++) /* start at the offset times the activation sum */
                        a32[i] = _mm256_slli_epi32(_mm256_set1_epi32(x.ns16[i * k16 + 2 * s + hh]), q3 ? 2 : 5);
                    if (xc) {
                        LC_FN(x16h_expanded)(mr, 4, 2, xc, h, x.xq, k, x0, a32);
                    } else {
                        __m256i cg[4];
                        if (q3)
                            LC_FN(x16h_threes)(_mm256_loadu_si256((const __m256i *)(ql + 64 * hh + 32 * h)),
                                               _mm256_loadu_si256((const __m256i *)(qh + 32 * h)), hh, cg);
                        else
                            LC_FN(x16h_sixes)(_mm256_loadu_si256((const __m256i *)(ql + 128 * hh + 32 * h)),
                                              _mm256_loadu_si256((const __m256i *)(ql + 128 * hh + 64 + 32 * h)),
                                              _mm256_loadu_si256((const __m256i *)(qh + 64 * hh + 32 * h)), cg);
                        for (int i = 0; i < mr; i++) {
                            const int8_t *xr = x.xq + i * k + x0;
                            __m256i p0 = _mm256_add_epi16(_mm256_maddubs_epi16(cg[0], LC_FN(x4)(xr)),
                                                          _mm256_maddubs_epi16(cg[1], LC_FN(x4)(xr + 4)));
                            __m256i p1 = _mm256_add_epi16(_mm256_maddubs_epi16(cg[2], LC_FN(x4)(xr + 8)),
                                                          _mm256_maddubs_epi16(cg[3], LC_FN(x4)(xr + 12)));
                            a32[i] = _mm256_add_epi32(a32[i], _mm256_add_epi32(_mm256_madd_epi16(p0, ones), _mm256_madd_epi16(p1, ones)));
                        }
                    }
                    for (int i = 0; i < mr; i++)
                        out[i] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(a32[i]), _mm256_mul_ps(sv, _mm256_set1_ps(x.dx32[i * k32 + s])), out[i]);
                }
            }
        }
    }
}

#define LC_X16H_ROWS(T)                                                                                    \
    switch (mr) {                                                                                          \
    case 1: LC_FN(x16h_panel)(T, 1, p, h, k, xr, xc, res); break;                                              \
    case 2: LC_FN(x16h_panel)(T, 2, p, h, k, xr, xc, res); break;                                              \
    default: LC_FN(x16h_panel)(T, 3, p, h, k, xr, xc, res); break;                                             \
    }

#ifndef LC_X16_EXPAND_ROWS2 /* steps of this many rows expand a panel's codes to bytes once (x16h_expand) */
#define LC_X16_EXPAND_ROWS2 12
#endif

/* out[t, n] (row stride ldo) for the packed matrix w of n rows: panels split over threads, each read
   half by half once per LC_X16_MR2 activation rows. From LC_X16_EXPAND_ROWS2 rows the codes of
   lc_x16_expands' types are expanded to bytes once per panel (x16h_expand), so no pass extracts them
   again. */
static void LC_FN(x16_matmul)(int type, const uint8_t *w, int64_t n, int64_t k, LC_FN(xsum) x, int64_t t, void *out,
                              int out_bf16, int64_t ldo, int nth) {
    int64_t panels = (n + 15) / 16, pb = lc_x16_panel_bytes(type, k);
#ifdef _OPENMP
#pragma omp parallel for num_threads(nth) schedule(static)
#endif
    for (int64_t pi = 0; pi < panels; pi++) {
        const uint8_t *p = w + pi * pb;
        uint8_t *xc = t >= LC_X16_EXPAND_ROWS2 && lc_x16_expands(type) ? lc_x16_expand_buffer((size_t)(16 * k)) : NULL;
        if (xc) LC_FN(x16h_expand)(type, p, k, xc);
        for (int h = 0; h < 2; h++) {
            int64_t first = 16 * pi + 8 * h;
            if (first >= n) break;
            int cols = (int)(n - first < 8 ? n - first : 8);
            for (int64_t t0 = 0; t0 < t; t0 += LC_X16_MR2) {
                int mr = (int)(t - t0 < LC_X16_MR2 ? t - t0 : LC_X16_MR2);
                LC_FN(xsum) xr = {x.xq + t0 * k, x.ns16 + t0 * (k / 16), x.ns32 + t0 * (k / 32),
                                  x.dx32 + t0 * (k / 32), x.fs32 + t0 * (k / 32)};
                __m256 res[LC_X16_MR2];
                switch (type) {
                case LC_Q4_0: LC_X16H_ROWS(LC_Q4_0) break;
                case LC_Q4_1: LC_X16H_ROWS(LC_Q4_1) break;
                case LC_Q5_0: LC_X16H_ROWS(LC_Q5_0) break;
                case LC_Q5_1: LC_X16H_ROWS(LC_Q5_1) break;
                case LC_Q8_0: LC_X16H_ROWS(LC_Q8_0) break;
                case LC_Q2_K: LC_X16H_ROWS(LC_Q2_K) break;
                case LC_Q3_K: LC_X16H_ROWS(LC_Q3_K) break;
                case LC_Q4_K: LC_X16H_ROWS(LC_Q4_K) break;
                case LC_Q5_K: LC_X16H_ROWS(LC_Q5_K) break;
                default: LC_X16H_ROWS(LC_Q6_K) break;
                }
                for (int i = 0; i < mr; i++) {
                    float v[8];
                    _mm256_storeu_ps(v, res[i]);
                    int64_t at = (t0 + i) * ldo + first;
                    if (!out_bf16 && cols == 8) _mm256_storeu_ps((float *)out + at, res[i]);
                    else
                        for (int c = 0; c < cols; c++) lc_store(out, out_bf16, at + c, v[c]);
                }
            }
        }
    }
}
#undef LC_X16H_ROWS
