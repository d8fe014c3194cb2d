module @nothing {
}
