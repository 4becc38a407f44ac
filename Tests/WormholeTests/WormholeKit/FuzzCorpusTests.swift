import Foundation
import Testing
import WormholeFuzzing

@testable import WormholeKit

/// The fuzzer's committed corpus, replayed on every test run, and hand-made damage to every seed: each decoder of
/// bytes another process wrote must neither crash nor hang on any of them.
@Suite("Fuzz corpus and damaged inputs")
struct FuzzCorpusTests {
    static let corpus = URL(fileURLWithPath: #filePath)
        .deletingLastPathComponent().deletingLastPathComponent().deletingLastPathComponent().deletingLastPathComponent()
        .appendingPathComponent("Fuzz/corpus")

    @Test("Every input of the committed corpus decodes or is refused, without crashing")
    func corpus() async throws {
        try await offThePool {
            let files = try FileManager.default.contentsOfDirectory(atPath: Self.corpus.path)
            #expect(files.count >= WormholeFuzzing.seeds().count)
            for file in files {
                WormholeFuzzing.run(Array(try Data(contentsOf: Self.corpus.appendingPathComponent(file))))
            }
        }
    }

    @Test("Every seed truncated at every byte, with every byte flipped, and with huge lengths")
    func damagedSeeds() async throws {
        try await offThePool {
            for (_, seed) in WormholeFuzzing.seeds() {
                for length in 0...seed.count { WormholeFuzzing.run(Array(seed.prefix(length))) }
                for index in 1..<seed.count {
                    var flipped = seed
                    flipped[index] ^= 0xFF
                    WormholeFuzzing.run(flipped)
                }
                for offset in stride(from: 1, to: max(seed.count - 4, 1), by: 4) {
                    var huge = seed
                    huge.replaceSubrange(offset..<offset + 4, with: [0xFF, 0xFF, 0xFF, 0x7F])
                    WormholeFuzzing.run(huge)
                }
            }
        }
    }

    @Test("A seed decodes as what was written")
    func seedsDecode() async throws {
        try await offThePool {
            let seeds = Dictionary(uniqueKeysWithValues: WormholeFuzzing.seeds())
            let queue = try #require(seeds["queue-log"]).dropFirst()
            var records = 0
            Array(queue).withUnsafeBytes { buffer in
                var offset = 0
                while case .record(_, let size) = QueueFormat.parse(buffer, at: offset) {
                    records += 1
                    offset += size
                }
            }
            #expect(records == 3)
            #expect(QueueCursorFile.decode(Array(try #require(seeds["consumer-position"]).dropFirst()))?.offset == 4096)
            let slots = Array(try #require(seeds["consumer-position-slots"]).dropFirst())
            #expect(
                QueueCursorFile.decodeFile(slots)
                    == .position(.init(offset: 4160, last: .init(start: 4096, timestampNanoseconds: 1), generation: 8))
            )
        }
    }
}
