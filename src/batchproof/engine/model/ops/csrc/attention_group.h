/* attention_group.c's one entry, which attention.c's decode attention calls: the query heads of
 * one KV group together. Not part of the interface (kernels.h). */
#ifndef BP_ATTENTION_GROUP_H
#define BP_ATTENTION_GROUP_H
#include <stdint.h>

#include "kernels.h"

#ifdef BP_X86
/* attention.c's attend_avx2 for NH (1 to 3) heads that share one KV head: q, o and scores hold
 * the NH heads one after another (D floats each; scores L each). The same bits per head. */
BP_INTERNAL void bp_attend_group_avx2(const float *q, const float *keys, const float *values, float *o,
                                      float *scores, int64_t L, int64_t D, float scale, int NH);
#endif
#endif
