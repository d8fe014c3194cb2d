// Each verifier rejects what it should, naming the operand and the dimension.
// RUN: loomc verify %s --split-input-file --verify-diagnostics

func.func @embedding_hidden(%t: tensor<2x8xi32>, %w: tensor<128x16xf32>) {
  // expected-error @+1 {{'loom.embedding' op result dim 2 is 32 but must be 16 (hidden size of word)}}
  %0 = loom.embedding %t, %w : (tensor<2x8xi32>, tensor<128x16xf32>) -> tensor<2x8x32xf32>
  return
}

// -----

func.func @embedding_positions(%t: tensor<2x8xi32>, %w: tensor<128x16xf32>, %p: tensor<4x16xf32>) {
  // expected-error @+1 {{position dim 0 (4 positions) is smaller than the sequence length 8}}
  %0 = loom.embedding %t, %w, %p : (tensor<2x8xi32>, tensor<128x16xf32>, tensor<4x16xf32>) -> tensor<2x8x16xf32>
  return
}

// -----

func.func @embedding_tokens_rank(%t: tensor<16xi32>, %w: tensor<128x16xf32>) {
  // expected-error @+1 {{'loom.embedding' op tokens must have rank 2, got 'tensor<16xi32>'}}
  %0 = loom.embedding %t, %w : (tensor<16xi32>, tensor<128x16xf32>) -> tensor<2x8x16xf32>
  return
}

// -----

func.func @layer_norm_gamma(%x: tensor<2x8x16xf32>, %g: tensor<15xf32>, %b: tensor<16xf32>) {
  // expected-error @+1 {{'loom.layer_norm' op gamma dim 0 is 15 but must be 16 (last dim of input)}}
  %0 = loom.layer_norm %x, %g, %b : (tensor<2x8x16xf32>, tensor<15xf32>, tensor<16xf32>) -> tensor<2x8x16xf32>
  return
}

// -----

func.func @layer_norm_epsilon(%x: tensor<2x8x16xf32>, %g: tensor<16xf32>, %b: tensor<16xf32>) {
  // expected-error @+1 {{epsilon must be > 0}}
  %0 = loom.layer_norm %x, %g, %b {epsilon = 0.0 : f32} : (tensor<2x8x16xf32>, tensor<16xf32>, tensor<16xf32>) -> tensor<2x8x16xf32>
  return
}

// -----

func.func @linear_inner(%x: tensor<2x8x16xf32>, %w: tensor<32x48xf32>) {
  // expected-error @+1 {{'loom.linear' op weight dim 0 is 32 but must be 16 (last dim of input)}}
  %0 = loom.linear %x, %w : (tensor<2x8x16xf32>, tensor<32x48xf32>) -> tensor<2x8x48xf32>
  return
}

// -----

func.func @linear_transposed(%x: tensor<2x8x16xf32>, %w: tensor<128x16xf32>) {
  // expected-error @+1 {{'loom.linear' op result dim 2 is 16 but must be 128 (weight dim 0, weight is transposed)}}
  %0 = loom.linear %x, %w {transpose_weight} : (tensor<2x8x16xf32>, tensor<128x16xf32>) -> tensor<2x8x16xf32>
  return
}

// -----

func.func @linear_bias(%x: tensor<2x8x16xf32>, %w: tensor<16x48xf32>, %b: tensor<16xf32>) {
  // expected-error @+1 {{'loom.linear' op bias dim 0 is 16 but must be 48 (output features)}}
  %0 = loom.linear %x, %w, %b : (tensor<2x8x16xf32>, tensor<16x48xf32>, tensor<16xf32>) -> tensor<2x8x48xf32>
  return
}

// -----

func.func @linear_dtype(%x: tensor<2x8x16xf32>, %w: tensor<16x48xbf16>) {
  // expected-error @+1 {{'loom.linear' op weight element type 'bf16' differs from input element type 'f32'}}
  %0 = loom.linear %x, %w : (tensor<2x8x16xf32>, tensor<16x48xbf16>) -> tensor<2x8x48xf32>
  return
}

// -----

// Only the batch (dim 0) may be dynamic.
func.func @linear_dynamic(%x: tensor<4x?xf32>, %w: tensor<16x48xf32>) {
  // expected-error @+1 {{'loom.linear' op input dim 1 is dynamic (only the batch, dim 0, may be), got 'tensor<4x?xf32>'}}
  %0 = loom.linear %x, %w : (tensor<4x?xf32>, tensor<16x48xf32>) -> tensor<4x48xf32>
  return
}

// -----

func.func @linear_dynamic_batch_mismatch(%x: tensor<?x16xf32>, %w: tensor<16x48xf32>) {
  // expected-error @+1 {{'loom.linear' op result dim 0 is 4 but must be ? (same as input)}}
  %0 = loom.linear %x, %w : (tensor<?x16xf32>, tensor<16x48xf32>) -> tensor<4x48xf32>
  return
}

// -----

func.func @attention_heads(%qkv: tensor<2x8x48xf32>) {
  // expected-error @+1 {{'loom.attention' op qkv dim 2 (48) must be 3 * num_heads (5) * head_dim}}
  %0 = loom.attention %qkv {num_heads = 5} : (tensor<2x8x48xf32>) -> tensor<2x8x16xf32>
  return
}

// -----

func.func @attention_result(%qkv: tensor<2x8x48xf32>) {
  // expected-error @+1 {{'loom.attention' op result dim 2 is 48 but must be 16 (qkv dim 2 / 3)}}
  %0 = loom.attention %qkv {num_heads = 2} : (tensor<2x8x48xf32>) -> tensor<2x8x48xf32>
  return
}

// -----

func.func @attention_mask(%qkv: tensor<2x8x48xf32>, %m: tensor<2x4xf32>) {
  // expected-error @+1 {{'loom.attention' op key_mask dim 1 is 4 but must be 8 (sequence)}}
  %0 = loom.attention %qkv, %m {num_heads = 2} : (tensor<2x8x48xf32>, tensor<2x4xf32>) -> tensor<2x8x16xf32>
  return
}

// -----

func.func @attention_statistics(%qkv: tensor<2x8x48xf32>) {
  // expected-error @+1 {{'loom.attention' op lse dim 1 is 3 but must be 2 (num_heads)}}
  %0:2 = loom.attention %qkv {num_heads = 2} : (tensor<2x8x48xf32>) -> (tensor<2x8x16xf32>, tensor<2x3x8xf32>)
  return
}

// -----

func.func @attention_statistics_type(%qkv: tensor<2x8x48xf32>) {
  // expected-error @+1 {{'loom.attention' op result #1 must be ranked tensor of 32-bit float values, but got 'tensor<2x2x8xbf16>'}}
  %0:2 = loom.attention %qkv {num_heads = 2} : (tensor<2x8x48xf32>) -> (tensor<2x8x16xf32>, tensor<2x2x8xbf16>)
  return
}

// -----

func.func @attention_grad_statistics(%qkv: tensor<2x8x48xf32>, %g: tensor<2x8x16xf32>, %lse: tensor<2x2x4xf32>) {
  // expected-error @+1 {{'loom.attention_grad' op lse dim 2 is 4 but must be 8 (sequence)}}
  %0 = loom.attention_grad %qkv, %g, %lse {num_heads = 2} : (tensor<2x8x48xf32>, tensor<2x8x16xf32>, tensor<2x2x4xf32>) -> tensor<2x8x48xf32>
  return
}

// -----

func.func @attention_dropout(%qkv: tensor<2x8x48xf32>) {
  // expected-error @+1 {{'loom.attention' op dropout must be in [0, 1), got 1.000000e+00}}
  %0 = loom.attention %qkv {num_heads = 2, dropout = 1.0 : f32} : (tensor<2x8x48xf32>) -> tensor<2x8x16xf32>
  return
}

// -----

func.func @dropout_rate(%x: tensor<4xf32>) {
  // expected-error @+1 {{'loom.dropout' op rate must be in [0, 1), got -5.000000e-01}}
  %0 = loom.dropout %x {rate = -0.5 : f32} : tensor<4xf32>
  return
}

// -----

func.func @add_shapes(%a: tensor<4xf32>, %b: tensor<5xf32>) {
  // expected-error @+1 {{'loom.add' op requires the same type for all operands and results}}
  %0 = "loom.add"(%a, %b) : (tensor<4xf32>, tensor<5xf32>) -> tensor<4xf32>
  return
}

// -----

func.func @gelu_int(%a: tensor<4xi32>) {
  // expected-error @+1 {{'loom.gelu' op operand #0 must be ranked tensor of 32-bit float or bfloat16 type or 16-bit float values, but got 'tensor<4xi32>'}}
  %0 = loom.gelu %a : tensor<4xi32>
  return
}

// -----

// A loss's name (the training log's) belongs on a cross-entropy and is not empty.
func.func @loss_name_on_another_op(%x: tensor<2x8x16xf32>) {
  // expected-error @+1 {{attribute 'loom.loss_name' must be a non-empty string on a loom.cross_entropy}}
  %0 = loom.gelu %x {loom.loss_name = "lm loss"} : tensor<2x8x16xf32>
  return
}

// -----

func.func @loss_name_empty(%l: tensor<2x8x128xf32>, %y: tensor<2x8xi32>) {
  // expected-error @+1 {{attribute 'loom.loss_name' must be a non-empty string on a loom.cross_entropy}}
  %0 = loom.cross_entropy %l, %y {loom.loss_name = "", valid_vocab = 100} : (tensor<2x8x128xf32>, tensor<2x8xi32>) -> tensor<f32>
  return
}

// -----

func.func @cross_entropy_labels(%l: tensor<2x8x128xf32>, %y: tensor<2x7xi32>) {
  // expected-error @+1 {{'loom.cross_entropy' op labels dim 1 is 7 but must be 8 (sequence of logits)}}
  %0 = loom.cross_entropy %l, %y {valid_vocab = 100} : (tensor<2x8x128xf32>, tensor<2x7xi32>) -> tensor<f32>
  return
}

// -----

func.func @cross_entropy_mask(%l: tensor<2x8x128xf32>, %y: tensor<2x8xi32>, %m: tensor<3x8xf32>) {
  // expected-error @+1 {{'loom.cross_entropy' op loss_mask dim 0 is 3 but must be 2 (batch)}}
  %0 = loom.cross_entropy %l, %y, %m {valid_vocab = 100} : (tensor<2x8x128xf32>, tensor<2x8xi32>, tensor<3x8xf32>) -> tensor<f32>
  return
}

// -----

func.func @cross_entropy_statistics(%l: tensor<2x8x128xf32>, %y: tensor<2x8xi32>) {
  // expected-error @+1 {{'loom.cross_entropy' op lse dim 1 is 4 but must be 8 (sequence of logits)}}
  %0, %1 = loom.cross_entropy %l, %y {valid_vocab = 100} : (tensor<2x8x128xf32>, tensor<2x8xi32>) -> (tensor<f32>, tensor<2x4xf32>)
  return
}

// -----

func.func @cross_entropy_grad_statistics(%l: tensor<2x8x128xf32>, %y: tensor<2x8xi32>, %lse: tensor<8xf32>) {
  // expected-error @+1 {{'loom.cross_entropy_grad' op lse must have rank 2}}
  %0 = loom.cross_entropy_grad %l, %y, %lse {valid_vocab = 100} : (tensor<2x8x128xf32>, tensor<2x8xi32>, tensor<8xf32>) -> tensor<2x8x128xf32>
  return
}

// -----

func.func @cross_entropy_vocab(%l: tensor<2x8x128xf32>, %y: tensor<2x8xi32>) {
  // expected-error @+1 {{'loom.cross_entropy' op valid_vocab must be >= 1}}
  %0 = loom.cross_entropy %l, %y {valid_vocab = 0} : (tensor<2x8x128xf32>, tensor<2x8xi32>) -> tensor<f32>
  return
}

// -----

func.func @all_reduce_group(%x: tensor<4xf32>) {
  // expected-error @+1 {{'loom.all_reduce' op group_size must be >= 1, got 0}}
  %0 = loom.all_reduce %x {group = "tp", group_size = 0} : tensor<4xf32>
  return
}

// -----

func.func @all_reduce_kind(%x: tensor<4xf32>) {
  // expected-error @+1 {{'loom.all_reduce' op reduce must be "sum", "max" or "avg", got "prod"}}
  %0 = loom.all_reduce %x {group = "tp", group_size = 2, reduce = "prod"} : tensor<4xf32>
  return
}

// -----

func.func @all_gather_dim(%x: tensor<2x4xf32>) {
  // expected-error @+1 {{'loom.all_gather' op result dim 1 is 6 but must be 8 (group_size times the other side along dim)}}
  %0 = loom.all_gather %x {group = "tp", group_size = 2, dim = 1} : (tensor<2x4xf32>) -> tensor<2x6xf32>
  return
}

// -----

func.func @all_gather_range(%x: tensor<2x4xf32>) {
  // expected-error @+1 {{'loom.all_gather' op dim 2 is out of range for rank 2}}
  %0 = loom.all_gather %x {group = "tp", group_size = 2, dim = 2} : (tensor<2x4xf32>) -> tensor<2x4xf32>
  return
}

// -----

func.func @reduce_scatter_dim(%x: tensor<2x8xf32>) {
  // expected-error @+1 {{'loom.reduce_scatter' op input dim 0 is 2 but must be 4 (group_size times the other side along dim)}}
  %0 = loom.reduce_scatter %x {group = "tp", group_size = 2, dim = 0} : (tensor<2x8xf32>) -> tensor<2x8xf32>
  return
}

// -----

func.func @send_peer(%x: tensor<4xf32>) {
  // expected-error @+1 {{'loom.send' op peer 2 is outside group of size 2}}
  loom.send %x {group = "pp", group_size = 2, peer = 2} : tensor<4xf32>
  return
}

// -----

func.func @recv_group() {
  // expected-error @+1 {{'loom.recv' op group must name a process group}}
  %0 = loom.recv {group = "", group_size = 2, peer = 0} : tensor<4xf32>
  return
}

// -----

// expected-error @+1 {{argument #0: attribute 'loom.init' must be "normal", "zeros" or "ones"}}
func.func @bad_init(%w: tensor<4xf32> {loom.param = "w", loom.init = "uniform"}) {
  return
}

// -----

// expected-error @+1 {{argument #0: attribute 'loom.init_std' must be a positive float}}
func.func @bad_std(%w: tensor<4xf32> {loom.param = "w", loom.init = "normal", loom.init_std = -1.0 : f32}) {
  return
}

// -----

// expected-error @+1 {{argument #0: attribute 'loom.input' must be "tokens", "labels", "loss_mask", "attention_mask", "token_types", "sop_labels" or "sop_mask"}}
func.func @bad_input(%t: tensor<2x8xi32> {loom.input = "images"}) {
  return
}

// -----

// expected-error @+1 {{attribute 'loom.make_vocab_size_divisible_by' must be a positive integer}}
module attributes {loom.make_vocab_size_divisible_by = 0 : i64} {
}

// -----

// Model facts live in the ops, not in module attributes.
// expected-error @+1 {{attribute 'loom.num_layers' is not a known loom attribute}}
module attributes {loom.num_layers = 4 : i64} {
}

// -----

func.func @bad_layer(%x: tensor<4xf32>) {
  // expected-error @+1 {{attribute 'loom.layer' must be a non-negative integer}}
  %0 = loom.gelu %x {loom.layer = -1 : i64} : tensor<4xf32>
  return
}

// -----

func.func @weight_grad_empty(%x: tensor<4x0xf32>, %g: tensor<4x8xf32>) {
  // expected-error @+1 {{'loom.weight_grad' op input and grad need a non-empty last dimension}}
  %0 = loom.weight_grad %x, %g : (tensor<4x0xf32>, tensor<4x8xf32>) -> tensor<0x8xf32>
  return
}

// -----

func.func @moe_top_k(%x: tensor<2x8x16xf32>, %l: tensor<2x8x4xf32>, %g: tensor<4x32x16xf32>, %d: tensor<4x16x32xf32>) {
  // expected-error @+1 {{'loom.moe' op top_k must be in 1..4 (the experts), got 5}}
  %0, %1 = loom.moe %x, %l, %g, %g, %d {top_k = 5 : i64} : (tensor<2x8x16xf32>, tensor<2x8x4xf32>, tensor<4x32x16xf32>, tensor<4x32x16xf32>, tensor<4x16x32xf32>) -> (tensor<2x8x16xf32>, tensor<f32>)
  return
}

// -----

func.func @moe_logits(%x: tensor<2x8x16xf32>, %l: tensor<2x8x3xf32>, %g: tensor<4x32x16xf32>, %d: tensor<4x16x32xf32>) {
  // expected-error @+1 {{'loom.moe' op logits dim 2 is 3 but must be 4 (the experts of gate, dim 0)}}
  %0, %1 = loom.moe %x, %l, %g, %g, %d {top_k = 2 : i64} : (tensor<2x8x16xf32>, tensor<2x8x3xf32>, tensor<4x32x16xf32>, tensor<4x32x16xf32>, tensor<4x16x32xf32>) -> (tensor<2x8x16xf32>, tensor<f32>)
  return
}

// -----

func.func @moe_down(%x: tensor<2x8x16xf32>, %l: tensor<2x8x4xf32>, %g: tensor<4x32x16xf32>, %d: tensor<4x32x16xf32>) {
  // expected-error @+1 {{'loom.moe' op down dim 1 is 32 but must be 16 (hidden size of input)}}
  %0, %1 = loom.moe %x, %l, %g, %g, %d {top_k = 2 : i64} : (tensor<2x8x16xf32>, tensor<2x8x4xf32>, tensor<4x32x16xf32>, tensor<4x32x16xf32>, tensor<4x32x16xf32>) -> (tensor<2x8x16xf32>, tensor<f32>)
  return
}

// -----

func.func @moe_capacity(%x: tensor<2x8x16xf32>, %l: tensor<2x8x4xf32>, %g: tensor<4x32x16xf32>, %d: tensor<4x16x32xf32>) {
  // expected-error @+1 {{'loom.moe' op capacity_factor must be >= 0 (0: dropless), got -1}}
  %0, %1 = loom.moe %x, %l, %g, %g, %d {top_k = 2 : i64, capacity_factor = -1.0 : f32} : (tensor<2x8x16xf32>, tensor<2x8x4xf32>, tensor<4x32x16xf32>, tensor<4x32x16xf32>, tensor<4x16x32xf32>) -> (tensor<2x8x16xf32>, tensor<f32>)
  return
}
