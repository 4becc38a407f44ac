import CWormholeSystem

/// CRC-32C (Castagnoli), the checksum that guards every record on disk.
///
/// Computed in C, with the SSE 4.2 `crc32` instruction where the CPU has it: a checksum is taken on every pass
/// and every read.
enum CRC32C {
    static func checksum(_ bytes: UnsafeRawBufferPointer, continuing crc: UInt32 = 0) -> UInt32 {
        cwormhole_crc32c(crc, bytes.baseAddress, bytes.count)
    }

    static func checksum<Bytes: Collection<UInt8>>(_ bytes: Bytes) -> UInt32 {
        if let crc = bytes.withContiguousStorageIfAvailable({ checksum(UnsafeRawBufferPointer($0)) }) { return crc }
        return Array(bytes).withUnsafeBytes { checksum($0) }
    }
}
