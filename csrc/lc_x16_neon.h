/* Matmul on x16 panels (lc_x16_layout.h) with ARM NEON's dot product (Armv8.2 `sdot`): each 64-byte chunk
of codes is four 16-byte loads of 4 columns x 4 codes, and one vdotq_laneq_s32 adds those codes times 4
activation bytes (a lane of one 16-byte activation load) into the 4 columns' int32 sums. sdot is signed x
signed: 4-bit and 6-bit codes are small non-negative int8 values and Q8_0's stored q + 128 goes back to
q, so the offsets are those of the AVX2 kernel (lc_x16_avx2.h) without its int16 pair sums. Panel by
panel, LC_X16_MRN activation rows per pass. Included by lc_kernels.c for the NEON variant (aarch64). */

#define LC_X16_MRN 2

typedef lc_x16_sums LC_FN(xsum);

/* 4 columns' f16 values at p as float32. */
static inline float32x4_t LC_FN(h4)(const uint8_t *p) { return vcvt_f32_f16(vreinterpret_f16_u8(vld1_u8(p))); }
static inline float32x4_t LC_FN(u8f4)(const uint8_t *p) {
    return vcvtq_f32_u32(vmovl_u16(vget_low_u16(vmovl_u8(vld1_u8(p)))));
}
static inline float32x4_t LC_FN(i8f4)(const uint8_t *p) {
    return vcvtq_f32_s32(vmovl_s16(vget_low_s16(vmovl_s8(vld1_s8((const int8_t *)p)))));
}

/* acc + 4 groups of codes (c[m]: 4 columns x 4 codes) times activation bytes 4m..4m + 3 of xv. */
static inline int32x4_t LC_FN(sdot4)(int32x4_t acc, int8x16_t c0, int8x16_t c1, int8x16_t c2, int8x16_t c3, int8x16_t xv) {
    acc = vdotq_laneq_s32(acc, c0, xv, 0);
    acc = vdotq_laneq_s32(acc, c1, xv, 1);
    acc = vdotq_laneq_s32(acc, c2, xv, 2);
    return vdotq_laneq_s32(acc, c3, xv, 3);
}

/* acc[i][g] (columns 4g..4g+3) += the 32 nibble-coded values at q times activations xq row i from x0;
   with `fifth` (Q5_0, Q5_1, Q5_K) each code's fifth bit (bit `group` of its byte there) adds 16. */
static inline __attribute__((always_inline)) void LC_FN(x16n_nibbles)(const int mr, const uint8_t *q, const uint8_t *fifth,
                                                                      const int8_t *xq, int64_t k, int64_t x0,
                                                                      int32x4_t acc[][4]) {
    const uint8x16_t low = vdupq_n_u8(15), bit4 = vdupq_n_u8(16);
    for (int j = 0; j < 4; j += 2) { /* chunks j, j + 1 read activations x0 + 8j .. x0 + 8j + 16 */
        int8x16_t xv[LC_X16_MRN];
        for (int i = 0; i < mr; i++) xv[i] = vld1q_s8(xq + i * k + x0 + 8 * j);
        for (int g = 0; g < 4; g++) {
            uint8x16_t v0 = vld1q_u8(q + 64 * j + 16 * g), v1 = vld1q_u8(q + 64 * (j + 1) + 16 * g);
            uint8x16_t l0 = vandq_u8(v0, low), h0 = vshrq_n_u8(v0, 4), l1 = vandq_u8(v1, low), h1 = vshrq_n_u8(v1, 4);
            if (fifth) { /* groups 2j .. 2j + 3: their bits moved to bit 4 by byte shifts (negative: right) */
                uint8x16_t f = vld1q_u8(fifth + 16 * g);
                l0 = vorrq_u8(l0, vandq_u8(vshlq_u8(f, vdupq_n_s8((int8_t)(4 - 2 * j))), bit4));
                h0 = vorrq_u8(h0, vandq_u8(vshlq_u8(f, vdupq_n_s8((int8_t)(3 - 2 * j))), bit4));
                l1 = vorrq_u8(l1, vandq_u8(vshlq_u8(f, vdupq_n_s8((int8_t)(2 - 2 * j))), bit4));
                h1 = vorrq_u8(h1, vandq_u8(vshlq_u8(f, vdupq_n_s8((int8_t)(1 - 2 * j))), bit4));
            }
            int8x16_t lo0 = vreinterpretq_s8_u8(l0), hi0 = vreinterpretq_s8_u8(h0);
            int8x16_t lo1 = vreinterpretq_s8_u8(l1), hi1 = vreinterpretq_s8_u8(h1);
            for (int i = 0; i < mr; i++) acc[i][g] = LC_FN(sdot4)(acc[i][g], lo0, hi0, lo1, hi1, xv[i]);
        }
    }
}

/* The 16 columns of the panel at p against rows 0..mr of x: out[i][g] for columns 4g..4g+3. */
static inline __attribute__((always_inline)) void LC_FN(x16n_panel)(const int type, const int mr, const uint8_t *p,
                                                                    int64_t k, LC_FN(xsum) x, float32x4_t out[][4]) {
    const int64_t k16 = k / 16, k32 = k / 32, ub = lc_x16_unit_bytes(type);
    int32x4_t acc[LC_X16_MRN][4];
    for (int i = 0; i < mr; i++)
        for (int g = 0; g < 4; g++) out[i][g] = vdupq_n_f32(0.0f);
    if (type == LC_Q4_0 || type == LC_Q4_1 || type == LC_Q5_0 || type == LC_Q5_1 || type == LC_Q8_0) {
        const int with_min = type == LC_Q4_1 || type == LC_Q5_1;
        const int32_t offset = type == LC_Q4_0 ? 8 : type == LC_Q5_0 ? 16 : 0;
        for (int64_t s = 0; s < k32; s++) {
            const uint8_t *u = p + s * ub;
            for (int i = 0; i < mr; i++) /* offsets -8d (Q4_0), -16d (Q5_0): start at that x the activation sum */
                for (int g = 0; g < 4; g++) acc[i][g] = vdupq_n_s32(offset * x.ns32[i * k32 + s]);
            if (type == LC_Q8_0) {
                const uint8x16_t flip = vdupq_n_u8(0x80);
                for (int c8 = 0; c8 < 8; c8 += 4) { /* chunks c8..c8 + 3 read activations 4 c8 .. 4 c8 + 16 */
                    int8x16_t xv[LC_X16_MRN];
                    for (int i = 0; i < mr; i++) xv[i] = vld1q_s8(x.xq + i * k + 32 * s + 4 * c8);
                    for (int g = 0; g < 4; g++) {
                        int8x16_t q0 = vreinterpretq_s8_u8(veorq_u8(vld1q_u8(u + 32 + 64 * c8 + 16 * g), flip));
                        int8x16_t q1 = vreinterpretq_s8_u8(veorq_u8(vld1q_u8(u + 32 + 64 * (c8 + 1) + 16 * g), flip));
                        int8x16_t q2 = vreinterpretq_s8_u8(veorq_u8(vld1q_u8(u + 32 + 64 * (c8 + 2) + 16 * g), flip));
                        int8x16_t q3 = vreinterpretq_s8_u8(veorq_u8(vld1q_u8(u + 32 + 64 * (c8 + 3) + 16 * g), flip));
                        for (int i = 0; i < mr; i++) acc[i][g] = LC_FN(sdot4)(acc[i][g], q0, q1, q2, q3, xv[i]);
                    }
                }
            } else {
                const uint8_t *q = u + LC_X16_LEGACY_Q(type);
                LC_FN(x16n_nibbles)(mr, q, type == LC_Q5_0 || type == LC_Q5_1 ? q + 256 : NULL, x.xq, k, 32 * s, acc);
            }
            for (int g = 0; g < 4; g++) {
                float32x4_t dv = LC_FN(h4)(u + 8 * g);
                float32x4_t mv = with_min ? LC_FN(h4)(u + 32 + 8 * g) : vdupq_n_f32(0.0f);
                for (int i = 0; i < mr; i++) {
                    out[i][g] = vfmaq_f32(out[i][g], vcvtq_f32_s32(acc[i][g]), vmulq_n_f32(dv, x.dx32[i * k32 + s]));
                    if (with_min) out[i][g] = vfmaq_n_f32(out[i][g], mv, x.fs32[i * k32 + s]);
                }
            }
        }
    }
    const int64_t units256 = type >= LC_Q2_K ? k / 256 : 0;
    for (int64_t s8 = 0; s8 < units256; s8++) {
        const uint8_t *u = p + s8 * ub;
        if (type == LC_Q4_K || type == LC_Q5_K) {
            for (int j = 0; j < 8; j++) {
                int64_t s = 8 * s8 + j;
                for (int i = 0; i < mr; i++)
                    for (int g = 0; g < 4; g++) acc[i][g] = vdupq_n_s32(0);
                if (type == LC_Q4_K) LC_FN(x16n_nibbles)(mr, u + 320 + 256 * j, NULL, x.xq, k, 32 * s, acc);
                else LC_FN(x16n_nibbles)(mr, u + LC_X16_Q5_QL(j), u + LC_X16_Q5_QH(j), x.xq, k, 32 * s, acc);
                for (int g = 0; g < 4; g++) {
                    float32x4_t sv = vmulq_f32(LC_FN(h4)(u + 8 * g), LC_FN(u8f4)(u + 64 + 16 * j + 4 * g));
                    float32x4_t mv = vmulq_f32(LC_FN(h4)(u + 32 + 8 * g), LC_FN(u8f4)(u + 192 + 16 * j + 4 * g));
                    for (int i = 0; i < mr; i++) {
                        out[i][g] = vfmaq_f32(out[i][g], vcvtq_f32_s32(acc[i][g]), vmulq_n_f32(sv, x.dx32[i * k32 + s]));
                        out[i][g] = vfmsq_n_f32(out[i][g], mv, x.fs32[i * k32 + s]); /* the mins, subtracted */
                    }
                }
            }
        } else { /* LC_Q2_K, LC_Q3_K, LC_Q6_K: a scale per 16 values; offsets -4 and -32 x scale (Q3_K, Q6_K), a
                    min per 16 values (Q2_K: d sc sum(q x) - dmin m sum(x)) */
            const uint8x16_t low = vdupq_n_u8(15), top = vdupq_n_u8(0x30), two = vdupq_n_u8(3), four = vdupq_n_u8(4);
            const int q2 = type == LC_Q2_K, q3 = type == LC_Q3_K;
            const int32_t offset = q2 ? 0 : q3 ? 4 : 32;
            for (int j = 0; j < 8; j++) {
                const uint8_t *ql = u + (q2 ? LC_X16_Q2_Q(j) : q3 ? LC_X16_Q3_QL(j) : LC_X16_Q6_QL(j));
                const uint8_t *qh = u + (q3 ? LC_X16_Q3_QH(j) : LC_X16_Q6_QH(j)); /* unused for Q2_K */
                int64_t s = 8 * s8 + j;
                for (int hh = 0; hh < 2; hh++) {
                    int64_t x0 = 32 * s + 16 * hh;
                    int8x16_t xv[LC_X16_MRN];
                    for (int i = 0; i < mr; i++) {
                        xv[i] = vld1q_s8(x.xq + i * k + x0);
                        for (int g = 0; g < 4; g++) acc[i][g] = vdupq_n_s32(offset * x.ns16[i * k16 + 2 * s + hh]);
                    }
                    for (int g = 0; g < 4; g++) {
                        uint8x16_t cg[4];
                        if (q2 || q3) { /* code group m: bits 2m..2m + 1 of the 2-bit chunk (Q3_K: + bit 4 hh + m of the third bits) */
                            uint8x16_t lv = vld1q_u8(ql + 64 * hh + 16 * g);
                            for (int m = 0; m < 4; m++) {
                                cg[m] = vandq_u8(vshlq_u8(lv, vdupq_n_s8((int8_t)(-2 * m))), two);
                                if (q3)
                                    cg[m] = vorrq_u8(cg[m], vandq_u8(vshlq_u8(vld1q_u8(qh + 16 * g), vdupq_n_s8((int8_t)(2 - 4 * hh - m))), four));
                            }
                        } else {
                            uint8x16_t v0 = vld1q_u8(ql + 128 * hh + 16 * g), v1 = vld1q_u8(ql + 128 * hh + 64 + 16 * g);
                            uint8x16_t hv = vld1q_u8(qh + 64 * hh + 16 * g);
                            cg[0] = vorrq_u8(vandq_u8(v0, low), vandq_u8(vshlq_n_u8(hv, 4), top));
                            cg[1] = vorrq_u8(vshrq_n_u8(v0, 4), vandq_u8(vshlq_n_u8(hv, 2), top));
                            cg[2] = vorrq_u8(vandq_u8(v1, low), vandq_u8(hv, top));
                            cg[3] = vorrq_u8(vshrq_n_u8(v1, 4), vandq_u8(vshrq_n_u8(hv, 2), top));
                        }
                        for (int i = 0; i < mr; i++)
                            acc[i][g] = LC_FN(sdot4)(acc[i][g], vreinterpretq_s8_u8(cg[0]), vreinterpretq_s8_u8(cg[1]),
                                                     vreinterpretq_s8_u8(cg[2]), vreinterpretq_s8_u8(cg[3]), xv[i]);
                        float32x4_t scf, mv = vdupq_n_f32(0.0f);
                        if (q2) { /* the file's scale | min << 4 bytes; columns 4g..4g + 3 in the low half */
                            uint8x8_t sm = vld1_u8(u + LC_X16_Q2_SM(j) + 16 * hh + 4 * g);
                            scf = vcvtq_f32_u32(vmovl_u16(vget_low_u16(vmovl_u8(vand_u8(sm, vdup_n_u8(15))))));
                            mv = vmulq_f32(LC_FN(h4)(u + 32 + 8 * g), vcvtq_f32_u32(vmovl_u16(vget_low_u16(vmovl_u8(vshr_n_u8(sm, 4))))));
                        } else {
                            scf = LC_FN(i8f4)(u + (q3 ? LC_X16_Q3_SC(j) : LC_X16_Q6_SC(j)) + 16 * hh + 4 * g);
                        }
                        float32x4_t sv = vmulq_f32(LC_FN(h4)(u + 8 * g), scf);
                        for (int i = 0; i < mr; i++) {
                            float dx = x.dx32[i * k32 + s];
                            out[i][g] = vfmaq_f32(out[i][g], vcvtq_f32_s32(acc[i][g]), vmulq_n_f32(sv, dx));
                            if (q2) /* ns16 is minus the code sum: the min term added */
                                out[i][g] = vfmaq_n_f32(out[i][g], mv, (float)x.ns16[i * k16 + 2 * s + hh] * dx);
                        }
                    }
                }
            }
        }
    }
}

#define LC_X16N_ROWS(T)                                                                                    \
    if (mr == 1) LC_FN(x16n_panel)(T, 1, p, k, xr, res);                                                   \
    else LC_FN(x16n_panel)(T, 2, p, k, xr, res);

/* out[t, n] (row stride ldo) for the packed matrix w of n rows: panels split over threads, each read
   once per LC_X16_MRN activation rows. */
static void LC_FN(x16_matmul)(int type, const uint8_t *w, int64_t n, int64_t k, LC_FN(xsum) x, int64_t t, void *out,
                              int out_bf16, int64_t ldo, int nth) {
    int64_t panels = (n + 15) / 16, pb = lc_x16_panel_bytes(type, k);
    (void)nth;
#ifdef _OPENMP
#pragma omp parallel for num_threads(nth) schedule(static)
#endif
    for (int64_t pi = 0; pi < panels; pi++) {
        const uint8_t *p = w + pi * pb;
        int64_t first = 16 * pi;
        int cols = (int)(n - first < 16 ? n - first : 16);
        for (int64_t t0 = 0; t0 < t; t0 += LC_X16_MRN) {
            int mr = (int)(t - t0 < LC_X16_MRN ? t - t0 : LC_X16_MRN);
            LC_FN(xsum) xr = {x.xq + t0 * k, x.ns16 + t0 * (k / 16), x.ns32 + t0 * (k / 32), x.dx32 + t0 * (k / 32),
                              x.fs32 + t0 * (k / 32)};
            float32x4_t res[LC_X16_MRN][4];
            switch (type) {
            case LC_Q4_0: LC_X16N_ROWS(LC_Q4_0) break;
            case LC_Q4_1: LC_X16N_ROWS(LC_Q4_1) break;
            case LC_Q5_0: LC_X16N_ROWS(LC_Q5_0) break;
            case LC_Q5_1: LC_X16N_ROWS(LC_Q5_1) break;
            case LC_Q8_0: LC_X16N_ROWS(LC_Q8_0) break;
            case LC_Q2_K: LC_X16N_ROWS(LC_Q2_K) break;
            case LC_Q3_K: LC_X16N_ROWS(LC_Q3_K) break;
            case LC_Q4_K: LC_X16N_ROWS(LC_Q4_K) break;
            case LC_Q5_K: LC_X16N_ROWS(LC_Q5_K) break;
            default: LC_X16N_ROWS(LC_Q6_K) break;
            }
            for (int i = 0; i < mr; i++) {
                float v[16];
                for (int g = 0; g < 4; g++) vst1q_f32(v + 4 * g, res[i][g]);
                int64_t at = (t0 + i) * ldo + first;
                for (int c = 0; c < cols; c++) lc_store(out, out_bf16, at + c, v[c]);
            }
        }
    }
}
#undef LC_X16N_ROWS
