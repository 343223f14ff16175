/* The extension module, and the layout of the structs Python fills.
 *
 * Why an extension module that uses no Python API: the functions are called through
 * ctypes (kernels.py), but building them as `batchproof.engine.model.ops._kernels` lets
 * setuptools compile them with the system's C compiler at `pip install` and put the
 * shared library where importlib finds it, with no build system of our own. The empty
 * module below exists only so the library is a valid extension; a missing compiler leaves
 * the module out (optional=True) and the engine falls back to padded torch.
 *
 * Why the layout is exported: abi.py mirrors bp_weight, bp_layer, bp_shape and bp_moe as
 * ctypes Structures, and a field changed on one side only would have the fused decode step
 * read weights from the wrong place. So every load compares the mirrors' field names and
 * offsets, and each struct's size, with these, which the compiler computed. A field added
 * to a struct in kernels.h goes into its list here too.
 */
#include <Python.h>
#include <stddef.h>
#include <stdint.h>

#include "kernels.h"

typedef struct {
    const char *name;
    size_t offset;
} abi_field;

#define FIELD(type, name) {#name, offsetof(type, name)}

static const abi_field WEIGHT_FIELDS[] = {
    FIELD(bp_weight, num_parts), FIELD(bp_weight, types), FIELD(bp_weight, data), FIELD(bp_weight, rows),
    FIELD(bp_weight, row_bytes), {NULL, 0},
};

static const abi_field LAYER_FIELDS[] = {
    FIELD(bp_layer, attn_norm), FIELD(bp_layer, ffn_norm), FIELD(bp_layer, bqkv), FIELD(bp_layer, q_norm),
    FIELD(bp_layer, k_norm), FIELD(bp_layer, post_attn_norm), FIELD(bp_layer, post_ffn_norm),
    FIELD(bp_layer, wqkv), FIELD(bp_layer, wo), FIELD(bp_layer, w_gate_up), FIELD(bp_layer, w_down),
    FIELD(bp_layer, cos_table), FIELD(bp_layer, sin_table), FIELD(bp_layer, window), FIELD(bp_layer, k_cache),
    FIELD(bp_layer, v_cache), FIELD(bp_layer, q_norm_full), FIELD(bp_layer, k_norm_full), FIELD(bp_layer, moe),
    {NULL, 0},
};

static const abi_field SHAPE_FIELDS[] = {
    FIELD(bp_shape, dim), FIELD(bp_shape, ffn_dim), FIELD(bp_shape, num_heads), FIELD(bp_shape, num_kv_heads),
    FIELD(bp_shape, head_dim), FIELD(bp_shape, rope_dim), FIELD(bp_shape, max_len), FIELD(bp_shape, rope_style),
    FIELD(bp_shape, mlp_act), FIELD(bp_shape, eps), FIELD(bp_shape, scale), FIELD(bp_shape, numerics), {NULL, 0},
};

static const abi_field MOE_FIELDS[] = {
    FIELD(bp_moe, router), FIELD(bp_moe, gate_up), FIELD(bp_moe, down), FIELD(bp_moe, num_experts),
    FIELD(bp_moe, num_used), FIELD(bp_moe, ffn), FIELD(bp_moe, topk_normalised), {NULL, 0},
};

static const struct {
    size_t size;
    const abi_field *fields;
} STRUCTS[] = {
    [BP_ABI_WEIGHT] = {sizeof(bp_weight), WEIGHT_FIELDS},
    [BP_ABI_LAYER] = {sizeof(bp_layer), LAYER_FIELDS},
    [BP_ABI_SHAPE] = {sizeof(bp_shape), SHAPE_FIELDS},
    [BP_ABI_MOE] = {sizeof(bp_moe), MOE_FIELDS},
};

#define NUM_STRUCTS (int)(sizeof STRUCTS / sizeof *STRUCTS)

int64_t bp_abi_sizeof(int which) { return which >= 0 && which < NUM_STRUCTS ? (int64_t)STRUCTS[which].size : -1; }

/* Field `field` of struct `which`, or NULL past the last (fields are NULL-terminated). */
static const abi_field *field_at(int which, int field) {
    if (which < 0 || which >= NUM_STRUCTS || field < 0) return NULL;
    const abi_field *f = STRUCTS[which].fields;
    for (int i = 0; i < field && f->name; i++) f++;
    return f->name ? f : NULL;
}

const char *bp_abi_field(int which, int field) {
    const abi_field *f = field_at(which, field);
    return f ? f->name : NULL;
}

int64_t bp_abi_offset(int which, int field) {
    const abi_field *f = field_at(which, field);
    return f ? (int64_t)f->offset : -1;
}

/* Importable as a module too, so setuptools can build it; all use goes through ctypes. */
static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_kernels", "batch-invariant CPU kernels", -1, NULL};
PyMODINIT_FUNC PyInit__kernels(void) { return PyModule_Create(&module); }
