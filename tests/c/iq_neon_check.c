/* The NEON i-quant kernels (csrc/lc_iq_neon.h) against the portable decoder, from C: built into the same
   program as the library (it includes lc_kernels.c, so it reaches the static functions) for aarch64, with
   and without the dot product in the target, and run under qemu-aarch64 by
   tests/backends/test_iquants_neon.py. For random blocks of every i-quant and ternary type, MXFP4, NVFP4, Q1_0 and Q2_0:
   - decode: every sub-block's 32 codes and 8 lane scales from each variant's NEON decoder (portable: sdot
     or smull by the target; neon: sdot) equal lc_iq_dec_row's bit for bit (the decoder the gguf.quants
     parity tests pin);
   - dot products: each variant's 16-byte dot equals the integer sum, at the extremes too (+-127);
   - matmul: lc_matmul on both ISAs, 1-4 activation rows (the row kernel) and 8, 13 (the panel GEMM), odd
     sub-block counts, weight rows that are not whole panels, float32 and bfloat16 output, within float32
     summation error of the float64 product of the decoded weights and the quantized activations; and
     the two variants' row kernels give the same bits (their integer lanes and float order agree).
   Prints one line per failure and a summary; exit 1 on any failure. Usage: iq_neon_check */
#include "lc_kernels.c"

#include <stdio.h>

#if !defined(__aarch64__)
int main(void) {
    printf("not an aarch64 build\n");
    return 2;
}
#else
static uint32_t rng = 4242u;
static uint32_t next(void) { return rng = rng * 1664525u + 1013904223u; }

/* type id, values per block, bytes per block, where its f16 scale sits (-1: IQ1_M's split scale, -2:
   MXFP4's e8m0 exponent byte, -3: NVFP4's four ue4m3 bytes) */
#define NTYPES 15
static const int TYPES[NTYPES][4] = {{16, 256, 66, 0},  {17, 256, 74, 0},  {18, 256, 98, 0}, {19, 256, 50, 0},
                                     {20, 32, 18, 0},   {21, 256, 110, 0}, {22, 256, 82, 0}, {23, 256, 136, 0},
                                     {29, 256, 56, -1}, {34, 256, 54, 52}, {35, 256, 66, 64}, {39, 32, 17, -2},
                                     {40, 64, 36, -3},  {41, 128, 18, 0},  {42, 64, 18, 0}};

/* An f16 scale: `wide` any finite one (zeros and subnormals too), else normal in [2^-10, 2^-6). */
static uint16_t rand_f16(int wide) {
    if (wide) return (uint16_t)(((next() >> 8) % 31) << 10 | (next() & 0x3FF) | (next() & 0x8000));
    return (uint16_t)(((5 + next() % 4) << 10) | (next() & 0x3FF) | (next() & 0x8000));
}

static void fill_block(const int *t, uint8_t *b, int wide) {
    for (int i = 0; i < t[2]; i++) b[i] = (uint8_t)(next() >> 24);
    uint16_t h = rand_f16(wide);
    if (t[3] == -2) b[0] = wide ? (uint8_t)(next() >> 24) : (uint8_t)(118 + next() % 8);
    else if (t[3] == -3) { /* any byte (0 and 0x7F are zero scales), else exponents 6-7 */
        if (!wide)
            for (int i = 0; i < 4; i++) b[i] = (uint8_t)(0x30 + next() % 16);
    }
    else if (t[3] >= 0) memcpy(b + t[3], &h, 2);
    else /* IQ1_M: the scale's four nibbles on top of the four 16-bit words at byte 48 */
        for (int i = 0; i < 4; i++) b[49 + 2 * i] = (uint8_t)((b[49 + 2 * i] & 0x0F) | (((h >> (4 * i)) & 15) << 4));
}

static int bad = 0, checks = 0;

/* Each variant's decoder against lc_iq_dec_row on `rows` random rows of k values. */
static void check_decode(const int *t, int wide) {
    const int64_t k = t[1] == 32 ? 32 * 64 : 256 * 8, rows = 16, row_bytes = k / t[1] * t[2];
    uint8_t *w = malloc((size_t)(rows * row_bytes));
    for (int64_t b = 0; b < rows * k / t[1]; b++) fill_block(t, w + b * t[2], wide);
    int wrong = 0;
    for (int64_t r = 0; r < rows; r++)
        for (int64_t s = 0; s < k / 32; s++) {
            int8_t want[32], got[32];
            float lw[8], lg[8];
            lc_iq_dec_row(t[0], w + r * row_bytes, s, want, lw);
            iqn_dec_portable(t[0], w + r * row_bytes, s, got, lg);
            wrong += memcmp(want, got, 32) != 0 || memcmp(lw, lg, 32) != 0;
            checks++;
            if (!lc_isa_supported(LC_ISA_NEON)) continue; /* its code is built for the dot product */
#ifdef LC_ARM
            iqn_dec_neon(t[0], w + r * row_bytes, s, got, lg);
#endif
            wrong += memcmp(want, got, 32) != 0 || memcmp(lw, lg, 32) != 0;
            checks++;
        }
    if (wrong) printf("type %d decode (%s scales): %d sub-blocks differ from lc_iq_dec_row\n", t[0],
                      wide ? "any" : "normal", wrong);
    bad += wrong;
    free(w);
}

static void check_dot(int neon) {
    for (int trial = 0; trial < 2000; trial++) {
        int8_t v[16], x[16];
        int32_t want = 0;
        for (int j = 0; j < 16; j++) {
            int pick = (int)(next() >> 24);
            v[j] = trial < 4 ? (int8_t)(trial & 1 ? -127 : 127) : (int8_t)((int)(next() >> 24) % 255 - 127);
            x[j] = trial < 4 ? (int8_t)(trial & 2 ? -127 : 127) : (int8_t)(pick % 255 - 127);
            want += v[j] * x[j];
        }
        int32x4_t z = vdupq_n_s32(7);
        int32_t a = vaddvq_s32(iqn_dot16_portable(z, vld1q_s8(v), vld1q_s8(x))) - 28;
        int32_t b = want;
#ifdef LC_ARM
        if (neon) b = vaddvq_s32(iqn_dot16_neon(z, vld1q_s8(v), vld1q_s8(x))) - 28;
#endif
        checks += 2;
        if (a != want || b != want) {
            printf("dot16: portable %d neon %d want %d\n", a, b, want);
            bad++;
        }
    }
}

/* lc_matmul of one ISA against the float64 product; its output in got (float32 or bf16 widened). */
static void check_matmul(const int *t, int isa, int64_t n, int64_t k, int64_t rows, int bf16, const uint8_t *w,
                         const int8_t *xq, const float *xd, const float *xs, float *got) {
    const int64_t row_bytes = k / t[1] * t[2];
    void *out = malloc((size_t)(rows * n) * 4);
    if (lc_matmul(isa, t[0], w, n, k, row_bytes, xq, xd, xs, rows, out, bf16, n, 2)) {
        printf("type %d isa %d: lc_matmul refused\n", t[0], isa);
        bad++;
        free(out);
        return;
    }
    for (int64_t i = 0; i < rows * n; i++) got[i] = bf16 ? lc_bf16(((uint16_t *)out)[i]) : ((float *)out)[i];
    for (int64_t r = 0; r < rows; r++)
        for (int64_t j = 0; j < n; j++) {
            double want = 0, mag = 0;
            for (int64_t s = 0; s < k / 32; s++) {
                int8_t v[32];
                float ls[8];
                lc_iq_dec_row(t[0], w + j * row_bytes, s, v, ls);
                for (int m = 0; m < 32; m++) {
                    double term = (double)ls[m / 4] * v[m] * xq[r * k + 32 * s + m] * xd[r * (k / 4) + 8 * s + m / 4];
                    want += term;
                    mag += fabs(term);
                }
            }
            double err = fabs((double)got[r * n + j] - want);
            double bound = (k / 4 + 8) * ldexp(1.0, -23) * mag + (bf16 ? ldexp(1.0, -8) * fabs(want) : 0.0);
            checks++;
            if (!(err <= bound + 1e-30)) {
                bad++;
                printf("type %d isa %d k %lld rows %lld n %lld bf16 %d: out[%lld][%lld] %g want %g (bound %g)\n", t[0],
                       isa, (long long)k, (long long)rows, (long long)n, bf16, (long long)r, (long long)j,
                       got[r * n + j], want, bound);
            }
        }
    free(out);
}

int main(void) {
    int neon = lc_isa_supported(LC_ISA_NEON);
#ifdef LC_ARM
    const char *neon_dot = iqn_sdot_neon() ? "sdot" : "smull";
#else /* clang without the dot product in the target: no NEON ISA built */
    const char *neon_dot = "none";
#endif
    printf("dot products: portable variant %s, neon variant %s (the NEON ISA %s here)\n",
           iqn_sdot_portable() ? "sdot" : "smull", neon_dot, neon ? "runs" : "does not run");
    check_dot(neon);
    for (int ti = 0; ti < NTYPES; ti++) {
        const int *t = TYPES[ti];
        check_decode(t, 0);
        check_decode(t, 1);
        const int64_t ks[2] = {t[1] == 32 ? 32 * 7 : 256, t[1] == 32 ? 32 * 9 : 768}, ns[2] = {9, 35};
        const int64_t ts[6] = {1, 2, 3, 4, 8, 13};
        for (int ki = 0; ki < 2; ki++)
            for (int ni = 0; ni < 2; ni++) {
                int64_t k = ks[ki], n = ns[ni], row_bytes = k / t[1] * t[2];
                uint8_t *w = malloc((size_t)(n * row_bytes));
                for (int64_t b = 0; b < n * k / t[1]; b++) fill_block(t, w + b * t[2], 0);
                for (int ri = 0; ri < 6; ri++) {
                    int64_t rows = ts[ri];
                    float *x = malloc((size_t)(rows * k) * 4), *xd = malloc((size_t)(rows * k / 4) * 4);
                    float *xs = malloc((size_t)(rows * LC_XS(k)) * 4);
                    int8_t *xq = malloc((size_t)(rows * k));
                    float *a = malloc((size_t)(rows * n) * 4), *b = malloc((size_t)(rows * n) * 4);
                    for (int64_t i = 0; i < rows * k; i++) x[i] = (float)((int)(next() >> 16) - 32768) / 8192.0f;
                    lc_quantize(LC_ISA_PORTABLE, x, 0, rows, k, k, xq, xd, xs, 1);
                    int bf16 = (ki + ni + ri) % 5 == 4;
                    check_matmul(t, LC_ISA_PORTABLE, n, k, rows, bf16, w, xq, xd, xs, a);
                    if (neon) {
                        check_matmul(t, LC_ISA_NEON, n, k, rows, bf16, w, xq, xd, xs, b);
                        if (rows < LC_IQG_MIN_ROWS && memcmp(a, b, (size_t)(rows * n) * 4)) {
                            printf("type %d k %lld rows %lld: the two variants' row kernels differ\n", t[0],
                                   (long long)k, (long long)rows);
                            bad++;
                        }
                    }
                    free(x), free(xd), free(xs), free(xq), free(a), free(b);
                }
                free(w);
            }
    }
    printf("%d checks, %s\n", checks, bad ? "FAILED" : "all ok");
    return bad ? 1 : 0;
}
#endif
