/* lc_matmul on random blocks of one i-quant type, `reps` times on one thread, for
   benchmarks/neon_iq_insns.py (which runs it under qemu with an instruction-count plugin and takes the
   difference of two repetition counts: instructions per call, setup excluded).
   Usage: iq_matmul_reps TYPE ISA VALUES_PER_BLOCK BYTES_PER_BLOCK ROWS REPS */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "lc_kernels.h"

static uint32_t rng = 99u;
static uint32_t next(void) { return rng = rng * 1664525u + 1013904223u; }

int main(int argc, char **argv) {
    if (argc != 7) return 2;
    int type = atoi(argv[1]), isa = atoi(argv[2]), vals = atoi(argv[3]), bytes = atoi(argv[4]), reps = atoi(argv[6]);
    int64_t t = atoll(argv[5]), n = 64, k = 4096, row_bytes = k / vals * bytes;
    uint8_t *w = malloc((size_t)(n * row_bytes));
    for (int64_t i = 0; i < n * row_bytes; i++) w[i] = (uint8_t)(next() >> 24);
    /* a finite scale where each type keeps its f16 (IQ1_M's is spread over nibbles: random is finite
       enough for counting), MXFP4's exponent 2^-8 */
    int at = type == 34 ? 52 : type == 35 ? 64 : 0;
    for (int64_t b = 0; b < n * k / vals; b++) {
        uint8_t *p = w + b * bytes;
        if (type == 39) p[0] = 120;
        else if (type != 29) p[at] = 0, p[at + 1] = 0x20;
    }
    float *x = malloc((size_t)(t * k) * 4), *xd = malloc((size_t)(t * k / 4) * 4);
    float *xs = malloc((size_t)(t * (k / 16 + k / 4)) * 4), *out = malloc((size_t)(t * n) * 4);
    int8_t *xq = malloc((size_t)(t * k));
    for (int64_t i = 0; i < t * k; i++) x[i] = (float)((int)(next() >> 16) - 32768) / 8192.0f;
    lc_quantize(0, x, 0, t, k, k, xq, xd, xs, 1);
    for (int r = 0; r < reps; r++)
        if (lc_matmul(isa, type, w, n, k, row_bytes, xq, xd, xs, t, out, 0, n, 1)) return 3;
    printf("%g\n", (double)out[0]);
    return 0;
}
