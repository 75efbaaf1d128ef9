/* Prototype (not in the library): Q1_0 one-row matmul on AVX-512 VNNI, the row-at-a-time loop of
   csrc/lc_lowbit_rows.h (lb_brow) against an x16 form of the same bytes as the file: 16 rows interleaved,
   per 128-value unit d[16] (f16) then 32 64-bit masks (bit 4c + b: row c, value 4g + b), each mask ->
   bytes 0/1 (one masked move) -> one vpdpbusd against 4 broadcast activations for 16 rows; a 32-value sum
   is then 2 * (bits . x) - sum(x). Prints the largest difference of the two outputs and the time of
   each over 5 alternated rounds (4096x4096, one thread, CPU time), for docs/performance.md's note on an
   x16 form for the low-bit types.
   gcc -O3 -o /tmp/lowbit_x16_proto benchmarks/c/lowbit_x16_proto.c && flock /tmp/bench.lock /tmp/lowbit_x16_proto */
#include <immintrin.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now(void) { struct timespec t; clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t); return t.tv_sec + 1e-9 * t.tv_nsec; }
static uint32_t rng = 1;
static uint32_t nx(void) { return rng = rng * 1664525u + 1013904223u; }

__attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni,f16c")))
static void rows(const uint8_t *w, int n, int k, const int8_t *xq, const float *xd, float *out) {
    const __m512i ones = _mm512_set1_epi8(1);
    for (int r = 0; r < n; r++) {
        const uint8_t *row = w + (size_t)r * (k / 128) * 18;
        __m512 a0 = _mm512_setzero_ps(), a1 = _mm512_setzero_ps();
        for (int ib = 0; ib < k / 128; ib++) {
            const uint8_t *b = row + 18 * ib;
            uint16_t h; memcpy(&h, b, 2);
            const __m512 d = _mm512_set1_ps(_cvtsh_ss(h));
            uint64_t bits[2]; memcpy(bits, b + 2, 16);
            for (int g = 0; g < 2; g++) {
                __m512i x = _mm512_loadu_si512(xq + 128 * ib + 64 * g);
                x = _mm512_mask_sub_epi8(x, _cvtu64_mask64(~bits[g]), _mm512_setzero_si512(), x);
                __m512i p = _mm512_dpbusd_epi32(_mm512_setzero_si512(), ones, x);
                __m512 f = _mm512_mul_ps(d, _mm512_loadu_ps(xd + 32 * ib + 16 * g));
                if (g) a1 = _mm512_fmadd_ps(f, _mm512_cvtepi32_ps(p), a1); else a0 = _mm512_fmadd_ps(f, _mm512_cvtepi32_ps(p), a0);
            }
        }
        out[r] = _mm512_reduce_add_ps(_mm512_add_ps(a0, a1));
    }
}

__attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni,f16c")))
static void x16(const uint8_t *p, int n, int k, const int8_t *xq, const float *dx32, const int32_t *ns32, float *out) {
    const __m512i ones = _mm512_set1_epi8(1);
    const size_t ub = 32 + 256;
    for (int pn = 0; pn < n / 16; pn++) {
        const uint8_t *panel = p + (size_t)pn * (k / 128) * ub;
        __m512 f0 = _mm512_setzero_ps(), f1 = _mm512_setzero_ps();
        for (int u = 0; u < k / 128; u++) {
            const uint8_t *un = panel + u * ub;
            _mm_prefetch((const char *)un + 4096, _MM_HINT_T0);
            const __m512 d = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)un));
            const uint64_t *m = (const uint64_t *)(un + 32);
            for (int s = 0; s < 4; s++) {
                __m512i c0 = _mm512_setzero_si512(), c1 = _mm512_setzero_si512();
                const int8_t *x = xq + 128 * u + 32 * s;
                for (int g = 0; g < 8; g += 2) {
                    int32_t x0, x1; memcpy(&x0, x + 4 * g, 4); memcpy(&x1, x + 4 * g + 4, 4);
                    c0 = _mm512_dpbusd_epi32(c0, _mm512_maskz_mov_epi8(_cvtu64_mask64(m[8 * s + g]), ones), _mm512_set1_epi32(x0));
                    c1 = _mm512_dpbusd_epi32(c1, _mm512_maskz_mov_epi8(_cvtu64_mask64(m[8 * s + g + 1]), ones), _mm512_set1_epi32(x1));
                }
                /* sum v x = 2 sum_set x - sum x = 2 (c0 + c1) + ns32 */
                __m512i t = _mm512_add_epi32(_mm512_slli_epi32(_mm512_add_epi32(c0, c1), 1), _mm512_set1_epi32(ns32[4 * u + s]));
                __m512 f = _mm512_mul_ps(d, _mm512_set1_ps(dx32[4 * u + s]));
                if (s & 1) f1 = _mm512_fmadd_ps(f, _mm512_cvtepi32_ps(t), f1); else f0 = _mm512_fmadd_ps(f, _mm512_cvtepi32_ps(t), f0);
            }
        }
        _mm512_storeu_ps(out + 16 * pn, _mm512_add_ps(f0, f1));
    }
}

int main(void) {
    const int n = 4096, k = 4096;
    uint8_t *w = aligned_alloc(64, (size_t)n * k / 128 * 18);
    for (size_t i = 0; i < (size_t)n * k / 128 * 18; i++) w[i] = (uint8_t)(nx() >> 24);
    for (size_t b = 0; b < (size_t)n * k / 128; b++) { w[18 * b] = 0; w[18 * b + 1] = 0x20; }
    uint8_t *p = aligned_alloc(64, (size_t)n * k / 128 * 288);
    memset(p, 0, (size_t)n * k / 128 * 288);
    for (int pn = 0; pn < n / 16; pn++)
        for (int u = 0; u < k / 128; u++) {
            uint8_t *un = p + ((size_t)pn * (k / 128) + u) * 288;
            for (int c = 0; c < 16; c++) {
                const uint8_t *b = w + ((size_t)(16 * pn + c) * (k / 128) + u) * 18;
                memcpy(un + 2 * c, b, 2);
                for (int j = 0; j < 128; j++) {
                    int bit = (b[2 + j / 8] >> (j % 8)) & 1;
                    int g = j / 4, bb = j % 4;
                    if (bit) ((uint64_t *)(un + 32))[g] |= 1ull << (4 * c + bb);
                }
            }
        }
    int8_t *xq = malloc(k); float *xd = malloc(k / 4 * 4), *dx32 = malloc(k / 32 * 4); int32_t *ns32 = malloc(k / 32 * 4);
    for (int i = 0; i < k; i++) xq[i] = (int8_t)((int)(nx() >> 24) % 255 - 127);
    for (int s = 0; s < k / 32; s++) {
        dx32[s] = 0.01f + (nx() >> 24) / 25600.0f; int sum = 0;
        for (int j = 0; j < 32; j++) sum += xq[32 * s + j];
        ns32[s] = -sum;
        for (int l = 0; l < 8; l++) xd[8 * s + l] = dx32[s];
    }
    float *o1 = malloc(n * 4), *o2 = malloc(n * 4);
    rows(w, n, k, xq, xd, o1); x16(p, n, k, xq, dx32, ns32, o2);
    double md = 0; for (int i = 0; i < n; i++) { double e = o1[i] - o2[i]; if (e < 0) e = -e; if (e > md) md = e; }
    printf("max |row - x16| %g (out[0] %g)\n", md, o1[0]);
    for (int round = 0; round < 5; round++) {
        int reps = 300; double t0 = now();
        for (int i = 0; i < reps; i++) rows(w, n, k, xq, xd, o1);
        double t1 = now();
        for (int i = 0; i < reps; i++) x16(p, n, k, xq, dx32, ns32, o2);
        double t2 = now();
        printf("row %.3f ms  x16 %.3f ms\n", 1e3 * (t1 - t0) / reps, 1e3 * (t2 - t1) / reps);
    }
    return 0;
}
