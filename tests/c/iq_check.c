/* The i-quant kernels (csrc/lc_iquants.h) from C, for CPUs the test machine lacks:
   tests/backends/test_kernels_iquants.py cross-compiles this file and the library for aarch64 and runs it
   under qemu-aarch64 (there the NEON ISA runs csrc/lc_iq_neon.h), and runs it natively too.
   For random blocks of every i-quant and ternary type and MXFP4 it prints a hash of the dequantized values (the
   test compares it across machines: dequantizing must give the same bits everywhere, and on x86 it is
   checked against gguf.quants), and checks lc_linear against the float64 product of those dequantized
   values with the same 8-bit activations (float32 summation error only). Usage: iq_check ISA */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "lc_kernels.h" /* the library's API, as it builds it (cc -Icsrc) */

static uint32_t rng = 777u;
static uint32_t next(void) { return rng = rng * 1664525u + 1013904223u; }

/* type id, values per block, bytes per block, where its f16 scale sits (-1: IQ1_M's split scale, -2:
   MXFP4's e8m0 exponent byte) */
#define NTYPES 12
static const int TYPES[NTYPES][4] = {{16, 256, 66, 0},  {17, 256, 74, 0},  {18, 256, 98, 0}, {19, 256, 50, 0},
                                     {20, 32, 18, 0},   {21, 256, 110, 0}, {22, 256, 82, 0}, {23, 256, 136, 0},
                                     {29, 256, 56, -1}, {34, 256, 54, 52}, {35, 256, 66, 64}, {39, 32, 17, -2}};

/* A normal f16 in [2^-10, 2^-6), either sign. */
static uint16_t rand_f16(void) { return (uint16_t)(((5 + next() % 4) << 10) | (next() & 0x3FF) | (next() & 0x8000)); }

static void fill_block(const int *t, uint8_t *b) {
    for (int i = 0; i < t[2]; i++) b[i] = (uint8_t)(next() >> 24);
    uint16_t h = rand_f16();
    if (t[3] == -2) b[0] = (uint8_t)(118 + next() % 8); /* 2^-9 .. 2^-2 */
    else if (t[3] >= 0) memcpy(b + t[3], &h, 2);
    else /* IQ1_M: the scale's four nibbles on top of the four 16-bit words at byte 48 */
        for (int i = 0; i < 4; i++) b[49 + 2 * i] = (uint8_t)((b[49 + 2 * i] & 0x0F) | (((h >> (4 * i)) & 15) << 4));
}

int main(int argc, char **argv) {
    int isa = argc > 1 ? atoi(argv[1]) : 0, bad = 0, cases = 0;
    const int64_t n = 9, k = 512;
    for (int ti = 0; ti < NTYPES; ti++) {
        const int *t = TYPES[ti];
        int64_t row_bytes = k / t[1] * t[2];
        uint8_t *w = malloc((size_t)(n * row_bytes));
        for (int64_t b = 0; b < n * k / t[1]; b++) fill_block(t, w + b * t[2]);
        float *deq = malloc((size_t)(n * k) * 4);
        int64_t ids[9];
        for (int i = 0; i < n; i++) ids[i] = i;
        if (lc_dequant_rows(t[0], w, k, row_bytes, ids, n, deq, 0)) return 2;
        uint64_t hash = 1469598103934665603ull; /* FNV-1a over the float bits */
        for (int64_t i = 0; i < n * k; i++) {
            uint32_t bits;
            memcpy(&bits, deq + i, 4);
            hash = (hash ^ bits) * 1099511628211ull;
        }
        printf("type %d dequant %016llx\n", t[0], (unsigned long long)hash);
        for (int rows = 1; rows <= 6; rows += 5) {
            float *x = malloc((size_t)(rows * k) * 4), *out = malloc((size_t)(rows * n) * 4);
            for (int64_t i = 0; i < rows * k; i++) x[i] = (float)((int)(next() >> 16) - 32768) / 8192.0f;
            int types[1] = {t[0]};
            uint64_t ptrs[1] = {(uint64_t)(uintptr_t)w};
            int64_t nrows[1] = {n}, rb[1] = {row_bytes};
            if (lc_linear(isa, x, 0, rows, k, 1, types, ptrs, nrows, rb, 0, out, 0, n, 2)) return 2;
            for (int r = 0; r < rows; r++)
                for (int j = 0; j < n; j++) {
                    double want = 0, mag = 0;
                    for (int64_t s = 0; s < k / 32; s++) { /* the kernels' activations: amax / 127, x * (1 / d) */
                        const float *xs = x + r * k + 32 * s;
                        float amax = 0;
                        for (int i = 0; i < 32; i++) amax = fabsf(xs[i]) > amax ? fabsf(xs[i]) : amax;
                        float d = amax / 127.0f, id = d > 0 ? 1.0f / d : 0.0f;
                        for (int i = 0; i < 32; i++) {
                            float q = nearbyintf(xs[i] * id);
                            q = q > 127 ? 127 : q < -127 ? -127 : q;
                            double term = (double)deq[j * k + 32 * s + i] * (double)q * (double)d;
                            want += term;
                            mag += fabs(term);
                        }
                    }
                    double err = fabs((double)out[r * n + j] - want), bound = (k / 4 + 8) * ldexp(1.0, -23) * mag;
                    cases++;
                    if (!(err <= bound + 1e-30)) {
                        bad++;
                        printf("type %d rows %d: out[%d][%d] %g want %g (bound %g)\n", t[0], rows, r, j,
                               out[r * n + j], want, bound);
                    }
                }
            free(x);
            free(out);
        }
        free(w);
        free(deq);
    }
    printf("%d cases, %s\n", cases, bad ? "FAILED" : "all ok");
    return bad ? 1 : 0;
}
