// Named weight tensors of a LLaMA-style decoder, whichever file format they came from.
#pragma once

#include <vector>

#include "model/tensor.h"

namespace thetaserve::model {

struct LayerWeights {
  TensorView attn_norm;                 // [hidden]
  TensorView wq, wk, wv, wo;            // [q_dim, hidden], [kv_dim, hidden] x2, [hidden, q_dim]
  TensorView bq, bk, bv;                // optional biases [q_dim], [kv_dim], [kv_dim]
  TensorView ffn_norm;                  // [hidden]
  TensorView w_gate, w_up;              // [intermediate, hidden]
  TensorView w_down;                    // [hidden, intermediate]
};

struct ModelWeights {
  TensorView tok_embeddings;  // [vocab, hidden]
  TensorView output_norm;     // [hidden]
  TensorView output;          // [vocab, hidden]; same data as tok_embeddings when tied
  std::vector<LayerWeights> layers;
};

}  // namespace thetaserve::model
