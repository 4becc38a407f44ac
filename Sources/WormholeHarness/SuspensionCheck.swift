import ArgumentParser
import Foundation
import GRDB
import WormholeCLI
import WormholeKit
import WormholeStore

/// `suspension-check`: a process that suspends its wormholes as an app going to the background does, for the tests of
/// `Wormhole.suspend()`; the test watches it from outside (its locks in `/proc/locks`, its files, its output).
///
/// Process-wide by design, suspension cannot be tried inside the test process, whose other tests run meanwhile. The
/// steps, each announced on standard output as a line (`step NAME`) or a JSON object (`{"call": …, "code": …}`):
/// 1. it writes through every mode (a pass, a suite, a queue with a consumer, a shared store with a remote-change
///    observer), then starts a suite update whose closure waits for the file `release` in `--control`, and says
///    `holding`;
/// 2. it suspends, tries a pass, a suite update, a coordinated pass, opening a consumer and a store write (each should
///    fail with the code `suspended`), waits 300 ms for locks to be released (which should fail: the update holds
///    one) and says `suspended`;
/// 3. once `release` exists, it waits for the update to end and the locks to go (which should succeed) and says
///    `released`; the test checks that it holds no lock while it stays suspended;
/// 4. once `resume` exists, it resumes, writes through every mode again and says `resumed`; it prints each message
///    its consumer and its observer are handed (`{"consumed": …}`, `{"remote": …}`) as they come, and exits once
///    `finish` exists.
struct SuspensionCheck: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "suspension-check",
        abstract: "Suspend this process's wormholes as an app going to the background does, step by step.",
        shouldDisplay: false
    )

    @Option(help: "The wormhole directory.") var directory: String
    @Option(help: "Where the test creates the files release, resume and finish.") var control: String

    func run() throws {
        let wormhole = try Wormhole(directory: directory)
        var coordinatedConfiguration = Wormhole.Configuration()
        coordinatedConfiguration.coordination = .coordinated
        let coordinated = try Wormhole(directory: directory, configuration: coordinatedConfiguration)
        // A short retention: the consumer marks itself alive every second, which the test watches stop.
        let queue = try wormhole.queue("jobs", retention: .seconds(4))
        let store = try SharedStore(
            path: directory + "/store.sqlite",
            migrator: StoreFixtures.itemsMigrator,
            configuration: .init(author: "suspended")
        )

        try wormhole.passMessageObject("before", identifier: "box")
        try wormhole.suite("settings").set("before", forKey: "state")
        try queue.enqueue("before")
        let consumer = try queue.consume(consumer: "worker", as: String.self) { message in
            Self.report(["consumed": message.value])
        }
        let observer = try store.observeRemoteChanges(consumer: "suspended") { transaction in
            Self.report(["remote": transaction.author])
        }
        try store.write { db in try Self.insert(db, "before") }

        // A suite update whose closure runs across the suspension, holding the suite's lock (and a permit).
        let updating = Thread {
            try? wormhole.suite("held").update { values in
                Output.line("step holding")
                _ = Self.waitFor("release", in: control)
                try values.set("held", forKey: "state")
            }
        }
        updating.start()
        guard waitFor("holding-seen") else { throw ValidationError("the test did not see the held lock in time") }

        Wormhole.suspend()
        Self.report(call: "pass") { () throws(WormholeError) in
            try wormhole.passMessageObject("while suspended", identifier: "box")
        }
        Self.report(call: "suite") { () throws(WormholeError) in
            try wormhole.suite("settings").set("while suspended", forKey: "state")
        }
        Self.report(call: "coordinated") { () throws(WormholeError) in
            try coordinated.passMessageObject("while suspended", identifier: "coordinated")
        }
        Self.report(call: "consumer") { () throws(WormholeError) in
            _ = try queue.consume(consumer: "second", as: String.self) { _ in }
        }
        do {
            try store.write { db in try Self.insert(db, "while suspended") }
            Self.report(["call": "store", "code": "none"])
        } catch {
            Self.report(["call": "store", "code": "\(error.code)"])
        }
        let releasedEarly = Self.waitUntilLocksAreReleased(atMost: .milliseconds(300))
        Self.report(["call": "released-while-held", "code": releasedEarly ? "true" : "false"])
        Output.line("step suspended")

        guard waitFor("release") else { throw ValidationError("no release within the time limit") }
        let released = Self.waitUntilLocksAreReleased(atMost: .seconds(10))
        Self.report(["call": "released", "code": released ? "true" : "false"])
        Output.line("step released")

        guard waitFor("resume") else { throw ValidationError("no resume within the time limit") }
        Wormhole.resume()
        try wormhole.passMessageObject("after", identifier: "box")
        try wormhole.suite("settings").set("after", forKey: "state")
        try store.write { db in try Self.insert(db, "after") }
        Output.line("step resumed")

        guard waitFor("finish") else { throw ValidationError("no finish within the time limit") }
        consumer.cancel()
        observer.cancel()
    }

    private static func insert(_ db: Database, _ value: String) throws {
        try db.execute(sql: "INSERT INTO item(writer, value) VALUES (?, ?)", arguments: ["suspended", value])
    }

    private func waitFor(_ name: String) -> Bool { Self.waitFor(name, in: control) }

    /// Waits up to 60 s for `name` in the control directory (the test's own time limit ends it sooner).
    private static func waitFor(_ name: String, in control: String) -> Bool {
        let deadline = Date().addingTimeInterval(60)
        while !FileManager.default.fileExists(atPath: control + "/" + name) {
            guard Date() < deadline else { return false }
            usleep(5_000)
        }
        return true
    }

    /// `Wormhole.waitUntilLocksAreReleased(atMost:)`, awaited from this command's thread (a harness's main thread,
    /// which may block).
    private static func waitUntilLocksAreReleased(atMost limit: Duration) -> Bool {
        let done = DispatchSemaphore(value: 0)
        let result = Locked(false)
        Task {
            let released = await Wormhole.waitUntilLocksAreReleased(atMost: limit)
            result.withLock { $0 = released }
            done.signal()
        }
        done.wait()
        return result.withLock { $0 }
    }

    private static func report(call: String, _ body: () throws(WormholeError) -> Void) {
        do throws(WormholeError) {
            try body()
            report(["call": call, "code": "none"])
        } catch {
            report(["call": call, "code": "\(error.code)"])
        }
    }

    private static func report(_ object: [String: String]) {
        let data = (try? JSONSerialization.data(withJSONObject: object, options: [.sortedKeys])) ?? Data()
        Output.line(String(decoding: data, as: UTF8.self))
    }
}
