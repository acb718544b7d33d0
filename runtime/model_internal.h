/* model_internal.h — the model's layout, shared by model.c and optim.c (not for Lua). */
#ifndef CLRT_MODEL_INTERNAL_H
#define CLRT_MODEL_INTERNAL_H
#include "clrt.h"

typedef struct clrt_param_info {
  char name[96];               /* Hugging Face name */
  int ndim;
  int64_t shape[2];
  int64_t offset, numel;       /* in floats, into the params (and grads, moments) arena */
  int loaded;                  /* set by clrt_model_load_safetensors */
} clrt_param_info;

/* Offsets (floats) of one layer's parameters; -1 when the architecture has none. */
typedef struct clrt_layer_offsets {
  int64_t ln1, wq, bq, wk, bk, wv, bv, wo, bo, qn, kn, ln2, wg, wu, wd;
} clrt_layer_offsets;

struct clrt_model {
  clrt_model_config cfg;
  int np;
  clrt_param_info *p;
  int64_t total;               /* floats in the params arena */
  clrt_layer_offsets *layer;
  int64_t wte, norm, head;     /* head == wte when tied */
  clrt_storage *params, *grads, *acts;
  float *inv_freq;             /* [D/2] */
  float *rope_cos, *rope_sin;  /* [rope_len, D/2] */
  int rope_len;
  /* The last forward kept for backward. */
  int saved, B, T;
  int64_t nv;                  /* rows with a target */
  int threads;                 /* OpenMP threads the activation layout was made for */
  /* Where the arenas live (clrt_device). On CUDA the RoPE tables are mirrored on the device
     (rope_dev: cos then sin) and the host stages the step's integer inputs in hidx. */
  int device;
  clrt_storage *rope_dev;
  int32_t *hidx;               /* [hidx_cap]: rowidx of the last forward, then scratch */
  size_t hidx_cap;
  /* bf16 matmuls: the linear layers take bf16 copies of their inputs and of the weights (wbf,
     refreshed from the fp32 master params when they change) and accumulate in fp32. On CUDA
     the output layer stays fp32; on the CPU only decode steps (few rows) read wbf, and with
     pack_decode on a CPU with AVX512-BF16 its linear weights are packed in panels of bf16
     pairs (clrt_linear_pack_bf16, same offsets; wbf_packed). */
  int bf16, wbf_packed;
  clrt_storage *wbf;           /* [total] uint16 on the device */
  /* Decode on the CPU (f32): the linear weights packed in 48-wide panels (clrt_linear_pack,
     same offsets as params), made on the first decode when pack_decode is on. */
  int pack_decode;
  clrt_storage *wpk;           /* [total] f32, CPU */
  /* The params->version each copy was made from (COPY_STALE: not made yet). */
  uint64_t wbf_ver, wpk_ver;
};

#define COPY_STALE UINT64_MAX

#endif
