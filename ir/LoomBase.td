//===- LoomBase.td - the `loom` Transformer dialect --------*- tablegen -*-===//
#ifndef LOOM_BASE_TD
#define LOOM_BASE_TD

include "mlir/IR/OpBase.td"
include "mlir/IR/AttrTypeBase.td"

def Loom_Dialect : Dialect {
  let name = "loom";
  let cppNamespace = "::loom";
  let summary = "Transformer-granularity ops and the collectives inserted by Loom's passes";
  let description = [{
    A training step is one `func.func` whose arguments are the parameters (each carrying
    `loom.param` = its global name and `loom.init` = its initializer) followed by the
    token ids and labels, and whose result is the scalar loss. Ops of a Transformer layer
    carry `loom.layer = N` so that the pipeline pass can cut between layers.
  }];
  let hasRegionArgAttrVerify = 1;
  let hasRegionResultAttrVerify = 1;
  let hasOperationAttrVerify = 1;
}

class Loom_Op<string mnemonic, list<Trait> traits = []>
    : Op<Loom_Dialect, mnemonic, traits>;

// Floating-point activations and weights.
def Loom_FloatTensor : RankedTensorOf<[F32, BF16, F16]>;
// Per-row statistics kept for a backward (attention's log-sum-exp): fp32 whatever the
// activations' type.
def Loom_StatsTensor : RankedTensorOf<[F32]>;
// Token ids, labels and positions.
def Loom_IndexTensor : RankedTensorOf<[I32, I64]>;
// Masks: 0/1 per token (loss mask) or per key position (attention padding mask).
def Loom_MaskTensor : RankedTensorOf<[F32, BF16, F16, I1]>;
def Loom_Scalar : 0DTensorOf<[F32]>;

#endif // LOOM_BASE_TD
