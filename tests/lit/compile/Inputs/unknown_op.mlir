module {
  func.func @train_step(%x: tensor<2x4x8xf32> {loom.input = "tokens"}) -> tensor<2x4x8xf32> {
    %y = loom.swish %x : tensor<2x4x8xf32>
    return %y : tensor<2x4x8xf32>
  }
}
