/* The x16 kernels of one ISA against the portable kernels on the GGUF blocks, from C (for ISAs the
   machine running the tests lacks: tests/backends/test_kernels_neon.py cross-compiles this file and the
   library for aarch64 and runs it under qemu-aarch64). Random blocks of every x16 type, several row
   counts and shapes; prints one line per case and exits 1 if any result differs by more than float32
   summation order can explain. Usage: x16_check ISA */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "lc_kernels.h" /* the library's API, as it builds it (cc -Icsrc) */

static uint32_t rng = 12345u;
static uint32_t next(void) { return rng = rng * 1664525u + 1013904223u; }
static float uniform(void) { return (float)(next() >> 8) / 16777216.0f; }

/* A normal f16 in [2^-10, 2^-6): plausible block scales. */
static void put_f16(uint8_t *p) {
    uint16_t h = (uint16_t)(((5 + next() % 4) << 10) | (next() & 0x3FF));
    memcpy(p, &h, 2);
}

/* GGUF blocks: type id, values and bytes per block, where its f16 scales sit. */
static void fill_block(int type, uint8_t *b, int bytes) {
    for (int i = 0; i < bytes; i++) b[i] = (uint8_t)next();
    switch (type) {
    case 2: case 6: case 8: put_f16(b); break;    /* Q4_0, Q5_0, Q8_0: d */
    case 3: case 7: put_f16(b); put_f16(b + 2); break; /* Q4_1, Q5_1: d, m */
    case 12: case 13: put_f16(b); put_f16(b + 2); break; /* Q4_K, Q5_K: d, dmin */
    case 10: put_f16(b + 80); put_f16(b + 82); break; /* Q2_K: d, dmin last */
    case 11: put_f16(b + 108); break;             /* Q3_K: d last */
    case 14: put_f16(b + 208); break;             /* Q6_K: d last */
    }
}

int main(int argc, char **argv) {
    int isa = argc > 1 ? atoi(argv[1]) : 3;
    if (!lc_isa_supported(isa)) {
        printf("ISA %d not supported here\n", isa);
        return 2;
    }
    const int types[10] = {2, 3, 6, 7, 8, 10, 11, 12, 13, 14}, unit[10] = {32, 32, 32, 32, 32, 256, 256, 256, 256, 256};
    const int bytes[10] = {18, 20, 22, 24, 34, 84, 110, 144, 176, 210};
    const int64_t ns[3] = {16, 20, 35}, ks[2] = {256, 512}, ts[5] = {1, 2, 3, 5, 13};
    int bad = 0, cases = 0;
    for (int ti = 0; ti < 10; ti++)
        for (int ni = 0; ni < 3; ni++)
            for (int ki = 0; ki < 2; ki++) {
                int type = types[ti];
                int64_t n = ns[ni], k = ks[ki], row_bytes = k / unit[ti] * bytes[ti];
                if (!lc_x16_supported(isa, type, k)) {
                    printf("type %d k %lld: no x16 kernel\n", type, (long long)k);
                    bad = 1;
                    continue;
                }
                uint8_t *w = malloc((size_t)(n * row_bytes));
                for (int64_t r = 0; r < n; r++)
                    for (int64_t b = 0; b < k / unit[ti]; b++) fill_block(type, w + r * row_bytes + b * bytes[ti], bytes[ti]);
                uint8_t *packed = malloc((size_t)lc_x16_bytes(type, n, k));
                if (lc_x16_repack(type, w, n, k, row_bytes, packed, 2)) return 3;
                for (int tj = 0; tj < 5; tj++) {
                    int64_t t = ts[tj];
                    float *x = malloc((size_t)(t * k) * 4), *want = malloc((size_t)(t * n) * 4), *got = malloc((size_t)(t * n) * 4);
                    for (int64_t i = 0; i < t * k; i++) x[i] = uniform() * 2.0f - 1.0f;
                    uint64_t pw = (uint64_t)(uintptr_t)w, pp = (uint64_t)(uintptr_t)packed;
                    int xtype = type | 0x100;
                    int64_t zero = 0;
                    int rc = lc_linear(0, x, 0, t, k, 1, &type, &pw, &n, &row_bytes, 0, want, 0, n, 1) |
                             lc_linear(isa, x, 0, t, k, 1, &xtype, &pp, &n, &zero, 0, got, 0, n, 2);
                    double worst = 0.0, scale = 1e-30;
                    for (int64_t i = 0; i < t * n; i++) {
                        double e = fabs((double)got[i] - want[i]);
                        worst = e > worst ? e : worst;
                        scale = fabs(want[i]) > scale ? fabs(want[i]) : scale;
                    }
                    int ok = rc == 0 && worst <= 1e-5 * scale + 1e-6;
                    printf("type %2d n %2lld k %lld t %lld: max |x16 - blocks| %.3g of max |out| %.3g %s\n", type, (long long)n,
                           (long long)k, (long long)t, worst, scale, ok ? "ok" : "FAIL");
                    bad |= !ok;
                    cases++;
                    free(x), free(want), free(got);
                }
                free(w), free(packed);
            }
    printf("%d cases, %s\n", cases, bad ? "FAILED" : "all ok");
    return bad;
}
