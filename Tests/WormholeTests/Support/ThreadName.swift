import CWormholeSystem

/// The calling thread's name, as `ps -L` shows it: which thread ran a callback.
func currentThreadName() -> String {
    var name = [CChar](repeating: 0, count: 16)
    _ = cwormhole_thread_name(&name, name.count)
    return String(decoding: name.prefix { $0 != 0 }.map { UInt8(bitPattern: $0) }, as: UTF8.self)
}
