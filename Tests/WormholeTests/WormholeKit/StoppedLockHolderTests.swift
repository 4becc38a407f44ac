import Foundation
import Testing
import WormholeKit

/// A process stopped (SIGSTOP, a debugger, a frozen cgroup) while it holds a mailbox's, a suite's or the coordination
/// lock holds nobody up for longer than the lock wait's limit: other writers fail with a typed error that names the
/// file and the stopped process, nothing is written by them, and once the holder goes on, everything is consistent
/// and every write that returned is there.
@Suite(
    "Directory engine: a stopped lock holder",
    .serialized,
    .limit(minutes: 2),
    .linuxOnly("the error names the holder from the lock table of Linux's proc file system")
)
struct StoppedLockHolderTests {
    enum Kind: String, CaseIterable, Sendable {
        case mailbox, suite, coordination
    }

    @Test(
        "Writers fail within the limit, naming the stopped holder; after SIGCONT nothing returned is lost",
        arguments: Kind.allCases
    )
    func stoppedHolder(kind: Kind) throws {
        let temporary = TemporaryDirectory()
        let directory = temporary("wormhole")
        var configuration = Wormhole.Configuration()
        configuration.fileOptions.lockWaitLimit = .milliseconds(300)
        if kind == .coordination { configuration.coordination = .coordinated }
        let wormhole = try Wormhole(directory: directory, configuration: configuration)

        let holder = try RunningTool(["stopped-holder", kind.rawValue, "--directory", directory])
        defer { _ = holder.finish(timeout: 10) }
        #expect(eventually(timeout: 20) { holder.outputLines.contains("locked") }, "\(holder.errorSoFar)")
        // Stopped by itself right after it printed; the kernel says so before the writes below are tried.
        #if os(Linux)
        #expect(eventually { Self.isStopped(holder.processIdentifier) })
        #else
        Thread.sleep(forTimeInterval: 0.5)
        #endif

        func write(_ value: String) throws {
            switch kind {
            case .mailbox, .coordination: try wormhole.passMessageObject(value, identifier: "box")
            case .suite: try wormhole.suite("box").set(value, forKey: "written")
            }
        }
        func read() throws -> String? {
            switch kind {
            case .mailbox, .coordination: try wormhole.message(withIdentifier: "box", as: String.self)
            case .suite: try wormhole.suite("box").value(forKey: "written", as: String.self)
            }
        }

        let started = ContinuousClock.now
        let refused = wormholeError { try write("while stopped") }
        let waited = ContinuousClock.now - started
        #expect(refused?.code == .timedOut, "\(String(describing: refused))")
        #expect(refused?.path?.hasPrefix(directory) == true, "\(String(describing: refused))")
        #if os(Linux)
        // Linux tells who holds it (/proc/locks), and that it is stopped; elsewhere the message says "another process".
        #expect(
            refused?.message.contains("process \(holder.processIdentifier)") == true,
            "\(String(describing: refused))"
        )
        #expect(refused?.message.contains("stopped") == true, "\(String(describing: refused))")
        #endif
        #expect(waited < .seconds(3), "the wait took \(waited), past its limit of 300 ms")
        if kind == .coordination {
            // Coordinated reads take the lock too, shared: they wait within the same limit.
            #expect(wormholeError { _ = try read() }?.code == .timedOut)
        } else {
            // Nothing written: the holder's own write is what is there. Reads take no lock, so they go on.
            #expect(try read() == "holder before")
        }

        holder.kill(signal: SIGCONT)
        let result = holder.finish(timeout: 20)
        #expect(result.status == 0, "\(result.error)")
        #expect(result.lines.last == "done")
        #expect(try read() == "holder after")
        try write("after")
        #expect(try read() == "after")
    }

    /// Whether the process is stopped, as `/proc/PID/stat` says (`T`).
    static func isStopped(_ processID: Int32) -> Bool {
        #if os(Linux) || os(Android)
        guard let text = try? String(contentsOfFile: "/proc/\(processID)/stat", encoding: .utf8),
            let close = text.lastIndex(of: ")")
        else { return false }
        return text[text.index(after: close)...].drop { $0 == " " }.first == "T"
        #else
        return false  // no /proc; the suite runs on Linux only
        #endif
    }
}
