// How the CPU backend multiplies activations with quantized weights.
#pragma once

namespace thetaserve::kernels {

enum class MatMulMode {
  // Default. Activations are quantized per row to int8 blocks of 32 (one f32 scale each) and
  // multiplied with Q8_0/Q4_0/Q4_1 weight blocks in integer arithmetic, as llama.cpp does:
  // decode streams the weights at close to memory speed. Logits move by a few percent of
  // their range (SmolLM2 Q4_1: up to 7.5e-2 of max |logit|, perplexity +0.33% on Austen).
  kQuantized,
  // f32 activations times weights dequantized to f32: the reference tests' setting (logits
  // within 1e-3 of transformers'), and a baseline for the quantized mode's fidelity.
  kExact,
};

}  // namespace thetaserve::kernels
