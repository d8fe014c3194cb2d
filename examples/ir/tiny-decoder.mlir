// A one-layer decoder written by hand, not generated from a config: no position embedding, an MLP
// with two up projections summed (a gated-MLP shape), an untied output layer stored
// [hidden, vocab], a vocabulary of 20 and a dynamic batch. No module attributes.
module {
  func.func @train_step(
      %wte: tensor<20x8xf32> {loom.param = "embed.weight", loom.init = "normal", loom.init_std = 0.02 : f32},
      %g1: tensor<8xf32> {loom.param = "l0.norm1.weight", loom.init = "ones"},
      %b1: tensor<8xf32> {loom.param = "l0.norm1.bias", loom.init = "zeros"},
      %wqkv: tensor<8x24xf32> {loom.param = "l0.qkv.weight", loom.init = "normal", loom.init_std = 0.02 : f32},
      %wo: tensor<8x8xf32> {loom.param = "l0.out.weight", loom.init = "normal", loom.init_std = 0.02 : f32},
      %bo: tensor<8xf32> {loom.param = "l0.out.bias", loom.init = "zeros"},
      %g2: tensor<8xf32> {loom.param = "l0.norm2.weight", loom.init = "ones"},
      %b2: tensor<8xf32> {loom.param = "l0.norm2.bias", loom.init = "zeros"},
      %wgate: tensor<8x16xf32> {loom.param = "l0.gate.weight", loom.init = "normal", loom.init_std = 0.02 : f32},
      %wup: tensor<8x16xf32> {loom.param = "l0.up.weight", loom.init = "normal", loom.init_std = 0.02 : f32},
      %bup: tensor<16xf32> {loom.param = "l0.up.bias", loom.init = "zeros"},
      %wdown: tensor<16x8xf32> {loom.param = "l0.down.weight", loom.init = "normal", loom.init_std = 0.02 : f32},
      %head: tensor<8x20xf32> {loom.param = "head.weight", loom.init = "normal", loom.init_std = 0.02 : f32},
      %tokens: tensor<?x4xi32> {loom.input = "tokens"},
      %labels: tensor<?x4xi32> {loom.input = "labels"},
      %mask: tensor<?x4xf32> {loom.input = "loss_mask"}) -> tensor<f32> {
    %x = loom.embedding %tokens, %wte : (tensor<?x4xi32>, tensor<20x8xf32>) -> tensor<?x4x8xf32>
    %h = loom.layer_norm %x, %g1, %b1 {loom.layer = 0 : i64} : (tensor<?x4x8xf32>, tensor<8xf32>, tensor<8xf32>) -> tensor<?x4x8xf32>
    %qkv = loom.linear %h, %wqkv {loom.layer = 0 : i64} : (tensor<?x4x8xf32>, tensor<8x24xf32>) -> tensor<?x4x24xf32>
    %a = loom.attention %qkv {causal, num_heads = 2 : i64, loom.layer = 0 : i64} : (tensor<?x4x24xf32>) -> tensor<?x4x8xf32>
    %o = loom.linear %a, %wo, %bo {loom.layer = 0 : i64} : (tensor<?x4x8xf32>, tensor<8x8xf32>, tensor<8xf32>) -> tensor<?x4x8xf32>
    %r = loom.add %x, %o {loom.layer = 0 : i64} : tensor<?x4x8xf32>
    %h2 = loom.layer_norm %r, %g2, %b2 {loom.layer = 0 : i64} : (tensor<?x4x8xf32>, tensor<8xf32>, tensor<8xf32>) -> tensor<?x4x8xf32>
    %gate = loom.linear %h2, %wgate {loom.layer = 0 : i64} : (tensor<?x4x8xf32>, tensor<8x16xf32>) -> tensor<?x4x16xf32>
    %act = loom.gelu %gate {loom.layer = 0 : i64} : tensor<?x4x16xf32>
    %up = loom.linear %h2, %wup, %bup {loom.layer = 0 : i64} : (tensor<?x4x8xf32>, tensor<8x16xf32>, tensor<16xf32>) -> tensor<?x4x16xf32>
    %mix = loom.add %act, %up {loom.layer = 0 : i64} : tensor<?x4x16xf32>
    %down = loom.linear %mix, %wdown {loom.layer = 0 : i64} : (tensor<?x4x16xf32>, tensor<16x8xf32>) -> tensor<?x4x8xf32>
    %y = loom.add %r, %down {loom.layer = 0 : i64} : tensor<?x4x8xf32>
    %logits = loom.linear %y, %head : (tensor<?x4x8xf32>, tensor<8x20xf32>) -> tensor<?x4x20xf32>
    %loss = loom.cross_entropy %logits, %labels, %mask {valid_vocab = 20 : i64} : (tensor<?x4x20xf32>, tensor<?x4xi32>, tensor<?x4xf32>) -> tensor<f32>
    return %loss : tensor<f32>
  }
}
