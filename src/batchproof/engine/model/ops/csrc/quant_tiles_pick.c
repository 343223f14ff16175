/* The register path's choice (quant.h): the twin of the instruction set in use (BP_PICK),
 * asked for the type's tile, or on aarch64 the NEON one. Each twin's tiles give the same bits; the
 * portable build has none, and goes through quant_linear.c's buffer. */
#include <stddef.h>

#include "quant.h"

qtile_fn bp_pick_qtile(int type) {
#ifdef BP_ARM
    /* BP_PICK knows x86's levels only; aarch64's one twin, unless capped to the portable level */
    return bp_isa_level() >= BP_ISA_NEON ? bp_qtile_neon(type) : NULL;
#else
    qtile_fn (*twin)(int) = BP_PICK(bp_qtile_avx512, bp_qtile_avx2, NULL);
    return twin ? twin(type) : NULL;
#endif
}

dequant_fn bp_pick_unpack_row(int type) {
    dequant_fn (*twin)(int) = BP_PICK(bp_unpack_row_avx2, bp_unpack_row_avx2, NULL);
    return twin ? twin(type) : NULL;
}

xtile_fn bp_pick_xtile(int type) {
    xtile_fn (*twin)(int) = BP_PICK(bp_xtile_avx512, NULL, NULL);
    return twin ? twin(type) : NULL;
}

int bp_fused_rows(int type) {
    return BP_PICK(bp_qtile_avx512(type) != NULL && !bp_pairs_pay(), bp_qtile_avx2(type) != NULL, 0) ? TALL_ROWS
                                                                                                     : FUSED_ROWS;
}
