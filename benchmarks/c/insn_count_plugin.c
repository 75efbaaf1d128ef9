/* A qemu TCG plugin (plugin API version 1, as qemu 7.2 has it) that prints the number of guest
   instructions executed, for benchmarks/neon_iq_insns.py: instruction counts are the one measurement of
   a kernel that qemu's emulation does not distort (its timings mean nothing). Declares the few API
   functions it calls, as Debian's qemu-user ships no plugin header. */
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

typedef uint64_t qemu_plugin_id_t;
struct qemu_plugin_tb;
typedef struct qemu_info_t qemu_info_t;
void qemu_plugin_register_vcpu_tb_trans_cb(qemu_plugin_id_t id, void (*cb)(qemu_plugin_id_t, struct qemu_plugin_tb *));
void qemu_plugin_register_vcpu_tb_exec_inline(struct qemu_plugin_tb *tb, int op, void *ptr, uint64_t imm);
size_t qemu_plugin_tb_n_insns(const struct qemu_plugin_tb *tb);
void qemu_plugin_register_atexit_cb(qemu_plugin_id_t id, void (*cb)(qemu_plugin_id_t, void *), void *userdata);

__attribute__((visibility("default"))) int qemu_plugin_version = 1;
static uint64_t count; /* one guest thread: the benchmark runs the kernels on one */

/* Each translated block adds its instruction count every time it runs (0: QEMU_PLUGIN_INLINE_ADD_U64). */
static void on_translate(qemu_plugin_id_t id, struct qemu_plugin_tb *tb) {
    (void)id;
    qemu_plugin_register_vcpu_tb_exec_inline(tb, 0, &count, qemu_plugin_tb_n_insns(tb));
}

static void report(qemu_plugin_id_t id, void *userdata) {
    (void)id, (void)userdata;
    fprintf(stderr, "insns %llu\n", (unsigned long long)count);
}

__attribute__((visibility("default"))) int qemu_plugin_install(qemu_plugin_id_t id, const qemu_info_t *info, int argc,
                                                               char **argv) {
    (void)info, (void)argc, (void)argv;
    qemu_plugin_register_vcpu_tb_trans_cb(id, on_translate);
    qemu_plugin_register_atexit_cb(id, report, NULL);
    return 0;
}
