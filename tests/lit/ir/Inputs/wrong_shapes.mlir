func.func @f(%x: tensor<2x8x16xf32>, %w: tensor<32x16xf32>) -> tensor<2x8x16xf32> {
  %0 = loom.linear %x, %w : (tensor<2x8x16xf32>, tensor<32x16xf32>) -> tensor<2x8x16xf32>
  return %0 : tensor<2x8x16xf32>
}
