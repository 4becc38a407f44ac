import Foundation
import Testing

@testable import WormholeKit

struct Query: Codable, Sendable { var term: String }
struct Answer: Codable, Sendable, Equatable { var result: String }
struct Refusal: Error, CustomStringConvertible { var description: String { "no such term" } }

/// Live messages and requests between real processes over Unix sockets.
@Suite("Live messages and requests", .limit(minutes: 2))
struct LiveTests {
    let directory = TemporaryDirectory()
    var location: [String] { ["--directory", directory("wormhole")] }
    func makeWormhole() throws -> Wormhole { try Wormhole(directory: directory("wormhole")) }
    /// Where the wormhole's sockets are, and how they are named: its `.live` on Linux.
    var placement: LiveSocketPlacement { LiveSocketPlacement.forWormhole(at: directory("wormhole")) }
    var live: String { placement.directory }

    /// The files of `.live` but its count of changes: the sockets.
    func sockets() throws -> [String] {
        try FileManager.default.contentsOfDirectory(atPath: live)
            .filter { $0 != LiveChangeCounter.fileName }
    }

    /// The count of changes in `.live/.changes`, nil when the file is missing or not 8 bytes.
    func changeCount() -> UInt64? {
        guard let bytes = FileManager.default.contents(atPath: live + "/.changes"), bytes.count == 8
        else { return nil }
        return bytes.withUnsafeBytes { UInt64(littleEndian: $0.loadUnaligned(as: UInt64.self)) }
    }

    /// A responder process, once it says that it responds; started and waited for off the cooperative pool.
    func responder(_ command: String, count: Int = 100) async throws -> RunningTool {
        let arguments = ["respond"] + location + ["lookup", "--exec", command, "--count", String(count)]
        return try await offThePool {
            let tool = try RunningTool(arguments)
            #expect(tool.waitForError(containing: "responding to"))
            return tool
        }
    }

    @Test("A request reaches a responder in another process and its reply comes back")
    func requestAndReply() async throws {
        let responder = try await responder(#"sed 's/"term"/"result"/; s/swift/SWIFT/'"#)
        let answer = try await makeWormhole().request(Query(term: "swift"), identifier: "lookup", as: Answer.self)
        #expect(answer == Answer(result: "SWIFT"))
        responder.kill()
    }

    @Test("Requests to a frozen responder time out, even once its backlog is full, and the time-out may be huge")
    func frozenResponder() async throws {
        let responder = try await responder(#"sed 's/"term"/"result"/'"#)
        let wormhole = try makeWormhole()
        // No overflow for a time-out meaning "wait as long as it takes".
        let answer = try await wormhole.request(
            Query(term: "a"),
            identifier: "lookup",
            as: Answer.self,
            timeout: .seconds(Int64.max)
        )
        #expect(answer == Answer(result: "a"))
        responder.kill(signal: SIGSTOP)
        defer { responder.kill() }
        // Each request leaves its connection in the stopped process's backlog (128 long): past it, connecting would
        // wait for good without the time-out.
        let started = ContinuousClock.now
        for index in 0..<140 {
            do {
                _ = try await wormhole.request(
                    Query(term: "\(index)"),
                    identifier: "lookup",
                    as: Answer.self,
                    timeout: .milliseconds(20)
                )
                Issue.record("a stopped responder answered")
            } catch {
                #expect(error.code == .timedOut, "request \(index): \(error)")
            }
        }
        #expect(ContinuousClock.now - started < .seconds(60))
    }

    @Test("In one process: typed requests, and a responder's error comes back to the caller")
    func inProcess() async throws {
        let wormhole = try makeWormhole()
        let responder = try wormhole.respondToRequests(withIdentifier: "lookup", as: Query.self) { query in
            guard query.term != "unknown" else { throw Refusal() }
            return Answer(result: query.term.uppercased())
        }
        #expect(
            try await wormhole.request(Query(term: "a"), identifier: "lookup", as: Answer.self) == Answer(result: "A")
        )
        do {
            _ = try await wormhole.request(Query(term: "unknown"), identifier: "lookup", as: Answer.self)
            Issue.record("expected an error")
        } catch {
            #expect(error.code == .remoteFailure)
            #expect(error.message.contains("no such term"))
        }
        responder.cancel()
    }

    @Test("Kept connections: 2,000 messages arrive in order; a listener that comes, stops or is killed is seen at once")
    func keptConnections() async throws {
        try await offThePool {
            let wormhole = try makeWormhole()
            let first = try RunningTool(["live-listen"] + location + ["ping", "--count", "2000", "--timeout", "60"])
            #expect(first.waitForError(containing: "listening"))
            for index in 0..<2000 { #expect(try wormhole.sendMessage(index, identifier: "ping") == 1) }
            let result = first.finish()
            #expect(result.lines == (0..<2000).map(String.init), "in order, none lost, over one kept connection")

            // A listener in this process comes after the connections were made: the next send reaches it.
            let received = Collector<Int>()
            let here = try wormhole.listenForLiveMessages(withIdentifier: "ping", as: Int.self, on: .notifierThread) {
                received.append($0)
            }
            #expect(try wormhole.sendMessage(1, identifier: "ping") == 1)
            #expect(eventually { received.values == [1] })
            let other = try RunningTool(["live-listen"] + location + ["ping", "--count", "100", "--timeout", "60"])
            #expect(other.waitForError(containing: "listening"))
            #expect(try wormhole.sendMessage(2, identifier: "ping") == 2)
            // Killed: its kept connection fails, its dead socket is removed, and the count says so.
            other.kill()
            _ = other.finish()
            #expect(try wormhole.sendMessage(3, identifier: "ping") == 1)
            #expect(eventually { received.values == [1, 2, 3] })
            // Stopped: nobody is left.
            here.cancel()
            #expect(throws: WormholeError.self) { try wormhole.sendMessage(4, identifier: "ping") }
            #expect(try sockets().isEmpty)
        }
    }

    @Test("A listener that stopped reading holds up only the sends to it, not this wormhole's other live sends")
    func stoppedListenerHoldsUpOnlyItsSends() async throws {
        try await offThePool {
            let wormhole = try makeWormhole()
            let stopped = try RunningTool(
                ["live-listen"] + location + ["frozen", "--count", "100000", "--timeout", "60"]
            )
            #expect(stopped.waitForError(containing: "listening"))
            let received = Collector<Int>()
            let here = try wormhole.listenForLiveMessages(withIdentifier: "other", as: Int.self, on: .notifierThread) {
                received.append($0)
            }
            stopped.kill(signal: SIGSTOP)
            // A thread that sends until the stopped listener's buffer is full, and then waits in `send`.
            let big = Data(count: 60_000)
            let filling = DispatchSemaphore(value: 0)
            Thread {
                for _ in 0..<100 { _ = try? wormhole.sendMessageData(big, identifier: "frozen") }
                filling.signal()
            }.start()
            #expect(filling.wait(timeout: .now() + 0.5) == .timedOut, "the buffer should fill and the sender wait")
            // Meanwhile another identifier's message goes at once.
            let other = DispatchSemaphore(value: 0)
            Thread {
                _ = try? wormhole.sendMessage(7, identifier: "other")
                other.signal()
            }.start()
            #expect(other.wait(timeout: .now() + 10) == .success, "a send to another listener was held up")
            #expect(eventually { received.values == [7] })
            // The stopped one killed: its connection fails, and the waiting sender goes on.
            stopped.kill()
            _ = stopped.finish()
            #expect(filling.wait(timeout: .now() + 30) == .success)
            here.cancel()
        }
    }

    @Test("A listener's socket is a datagram socket, its owner's alone; an older release's socket is passed over")
    func listenerSocket() async throws {
        try await offThePool {
            var options = FileTransiting.Options()
            options.filePermissions = 0o644
            let wormhole = try Wormhole(
                directory: directory("wormhole"),
                configuration: .init(fileOptions: options)
            )
            let received = Collector<Int>()
            let listener = try wormhole.listenForLiveMessages(withIdentifier: "ping", as: Int.self) {
                received.append($0)
            }
            let names = try sockets()
            #expect(names.count == 1)
            let name = try #require(names.first)
            #expect(name.hasPrefix(placement.naming.listenerPrefix(for: "ping")))
            var status = stat()
            #expect(lstat(live + "/" + name, &status) == 0)
            #expect(status.st_mode & S_IFMT == S_IFSOCK)
            // Whoever may write to it may send to it, and a datagram's sender is not checked: others may not.
            #expect(status.st_mode & 0o777 == 0o600)

            // A socket as an older release's listener made it (sequenced packets, named without `m.`): a sender of
            // this release neither sends to it nor removes it.
            let old = LiveSocket.prefix(for: "ping") + "\(getpid()).7"
            let oldSocket = try #require(try? PacketSocket.make().get())
            defer { oldSocket.close() }
            let liveDirectory = try DirectoryHandle.open(path: live, create: false, options: options)
            let address = try #require(UnixSocketAddress(directory: liveDirectory, name: old))
            #expect((try? oldSocket.bind(to: address).get()) != nil)
            #expect((try? oldSocket.listen(backlog: 1).get()) != nil)
            #expect(try wormhole.sendMessage(1, identifier: "ping") == 1)
            #expect(eventually { received.values == [1] })
            #expect(FileManager.default.fileExists(atPath: live + "/" + old))
            listener.cancel()
            #expect(try sockets() == [old])
        }
    }

    @Test("Listeners coming and going are counted in .live/.changes, which senders read instead of the directory")
    func changeCounter() async throws {
        try await offThePool {
            let wormhole = try makeWormhole()
            let received = Collector<Int>()
            let first = try wormhole.listenForLiveMessages(withIdentifier: "ping", as: Int.self) { received.append($0) }
            guard let afterFirst = changeCount() else {
                try Test.cancel("the directory's file system does not share the count (only ext4 and tmpfs do)")
            }
            #expect(afterFirst >= 1)
            #expect(try wormhole.sendMessage(1, identifier: "ping") == 1)
            // Another process's listener: counted once in place, so the sender's next message finds it.
            let other = try RunningTool(["live-listen"] + location + ["ping", "--count", "1", "--timeout", "60"])
            #expect(other.waitForError(containing: "listening"))
            #expect(changeCount() == afterFirst + 1)
            #expect(try wormhole.sendMessage(2, identifier: "ping") == 2)
            #expect(other.finish().lines == ["2"])
            // It removed its socket and counted it on its way out.
            #expect(changeCount() == afterFirst + 2)
            #expect(try wormhole.sendMessage(3, identifier: "ping") == 1)
            // A listener killed leaves its socket: the first sender to find it dead removes it and counts it.
            let killed = try RunningTool(["live-listen"] + location + ["ping", "--count", "100", "--timeout", "60"])
            #expect(killed.waitForError(containing: "listening"))
            #expect(try wormhole.sendMessage(4, identifier: "ping") == 2)
            killed.kill()
            _ = killed.finish()
            #expect(try wormhole.sendMessage(5, identifier: "ping") == 1)
            #expect(try sockets().count == 1)
            #expect(changeCount() == afterFirst + 4)
            #expect(eventually { received.values == [1, 2, 3, 4, 5] })
            // (The sender counted the removal: its next send reads the directory once more.)
            #expect(try wormhole.sendMessage(6, identifier: "ping") == 1)
            // A listener's socket put in place without counting it is not looked for: senders read the count, not
            // the directory (whose modification time the socket's rename moved). Counted, it is.
            let uncounted = try PacketSocket.make(.datagrams).get()
            defer { uncounted.close() }
            let liveHandle = try DirectoryHandle.open(path: live, create: false)
            let name = placement.naming.listenerPrefix(for: "ping") + "\(getpid()).1"
            #expect(
                (try? uncounted.bind(to: #require(UnixSocketAddress(directory: liveHandle, name: name))).get()) != nil
            )
            #expect(try wormhole.sendMessage(7, identifier: "ping") == 1)
            try #require(try LiveChangeCounter.open(in: liveHandle)).increment()
            #expect(try wormhole.sendMessage(8, identifier: "ping") == 2)
            first.cancel()
        }
    }

    @Test("A planted .live/.changes is refused with a clear error, never written through; removed, all is well")
    func plantedChangeCounter() async throws {
        try await offThePool {
            try FileManager.default.createDirectory(
                atPath: live,
                withIntermediateDirectories: true,
                attributes: [.posixPermissions: 0o700]
            )
            let target = directory("elsewhere")
            _ = FileManager.default.createFile(atPath: target, contents: Data())
            try FileManager.default.createSymbolicLink(
                atPath: live + "/.changes",
                withDestinationPath: target
            )
            let wormhole = try makeWormhole()
            // A listener it could not count would go unseen by senders that read the count: it is refused.
            let refused = wormholeError {
                _ = try wormhole.listenForLiveMessages(withIdentifier: "ping", as: Int.self) { _ in }
            }
            #expect(refused?.code == .untrustedFile, "\(String(describing: refused))")
            #expect(refused?.message.contains(".changes") == true, "\(String(describing: refused))")
            #expect(refused?.path?.hasSuffix(".live/.changes") == true, "\(String(describing: refused))")
            #expect(try FileManager.default.attributesOfItem(atPath: target)[.size] as? Int == 0)
            // Removed, the next call makes the count and listens.
            try FileManager.default.removeItem(atPath: live + "/.changes")
            let received = Collector<Int>()
            let listener = try wormhole.listenForLiveMessages(withIdentifier: "ping", as: Int.self) {
                received.append($0)
            }
            #expect(try wormhole.sendMessage(1, identifier: "ping") == 1)
            #expect(eventually { received.values == [1] })
            listener.cancel()
        }
    }

    @Test("A listener whose queue is full holds up a send only after every other listener has the message")
    func fullListenerLast() async throws {
        try await offThePool {
            let wormhole = try makeWormhole()
            let frozen = try RunningTool(["live-listen"] + location + ["ping", "--count", "100000", "--timeout", "60"])
            #expect(frozen.waitForError(containing: "listening"))
            let received = Collector<Int>()
            let here = try wormhole.listenForLiveMessages(withIdentifier: "ping", as: String.self, on: .notifierThread)
            {
                received.append(Int($0.prefix { $0 != ":" }) ?? -1)
            }
            frozen.kill(signal: SIGSTOP)
            // Messages of 60 KB fill the frozen listener's queue within a few, whatever the system's queue length.
            // Each is sent once this listener has the one before, so that only the frozen one ever fills.
            let padding = String(repeating: "x", count: 60_000)
            let sent = Locked(0)
            let sending = DispatchSemaphore(value: 0)
            Thread {
                for index in 0..<20 {
                    _ = try? wormhole.sendMessage("\(index):" + padding, identifier: "ping")
                    sent.withLock { $0 = index + 1 }
                    _ = eventually { received.count >= index + 1 }
                }
                sending.signal()
            }.start()
            #expect(sending.wait(timeout: .now() + 1) == .timedOut, "the frozen listener's queue should fill")
            let stuckAt = sent.withLock { $0 }
            #expect(stuckAt < 20)
            // The message whose send waits has reached this listener already.
            #expect(eventually { received.count == stuckAt + 1 }, "\(received.count) received, \(stuckAt) sent")
            frozen.kill()
            _ = frozen.finish()
            #expect(sending.wait(timeout: .now() + 30) == .success)
            #expect(eventually { received.values == Array(0..<20) })
            here.cancel()
        }
    }

    @Test("A listener stopped while a sender waits for room in its queue lets the sender go once its thread ends")
    func stoppedWhileSenderWaits() async throws {
        try await offThePool {
            let wormhole = try makeWormhole()
            let release = DispatchSemaphore(value: 0)
            let first = DispatchSemaphore(value: 0)
            // The callback runs on the thread that reads the socket, and blocks it: the queue fills.
            let listener = try wormhole.listenForLiveMessageData(withIdentifier: "slow", on: .notifierThread) { _ in
                first.signal()
                _ = release.wait(timeout: .now() + 30)
            }
            let done = DispatchSemaphore(value: 0)
            Thread {
                // Messages of 60 KB fill the queue within a few, whatever the system's queue length.
                for _ in 0..<20 { _ = try? wormhole.sendMessageData(Data(count: 60_000), identifier: "slow") }
                done.signal()
            }.start()
            #expect(first.wait(timeout: .now() + 10) == .success)
            #expect(done.wait(timeout: .now() + 0.5) == .timedOut, "the sender should wait for room")
            listener.cancel()
            // The thread ends after its callback, closing the socket: the waiting send fails, and the others find
            // nobody.
            for _ in 0..<20 { release.signal() }
            #expect(done.wait(timeout: .now() + 10) == .success)
            #expect(try sockets().isEmpty)
        }
    }

    @Test("Nobody listening: not reachable, at once")
    func notReachable() async throws {
        let wormhole = try makeWormhole()
        let start = Date()
        do {
            _ = try await wormhole.request(
                Query(term: "a"),
                identifier: "lookup",
                as: Answer.self,
                timeout: .seconds(600)
            )
            Issue.record("expected an error")
        } catch {
            #expect(error.code == .notReachable)
        }
        #expect(throws: WormholeError.self) { try wormhole.sendMessage(Query(term: "a"), identifier: "nobody") }
        // Nothing waits for a time-out here: with 10 s asked for, an answer well before it shows none was waited.
        // (Only a loose bound: tests that poll share the test runner's threads, and can delay this one.)
        #expect(Date().timeIntervalSince(start) < 60)
    }

    @Test("A slow responder: the request times out after its time-out")
    func timeout() async throws {
        let responder = try await responder("sleep 3; cat")
        let start = Date()
        do {
            _ = try await makeWormhole().request(
                Query(term: "a"),
                identifier: "lookup",
                as: Answer.self,
                timeout: .milliseconds(500)
            )
            Issue.record("expected a time-out")
        } catch let error as WormholeError {
            #expect(error.code == .timedOut)
        }
        #expect(Date().timeIntervalSince(start) >= 0.5, "not before its time-out")
        responder.kill()
    }

    @Test("A responder that fails: its error comes back")
    func responderFails() async throws {
        let responder = try await responder("echo 'boom: no index' >&2; exit 3")
        do {
            _ = try await makeWormhole().request(Query(term: "a"), identifier: "lookup", as: Answer.self)
            Issue.record("expected an error")
        } catch let error as WormholeError {
            #expect(error.code == .remoteFailure)
            #expect(error.message.contains("boom: no index"))
        }
        responder.kill()
    }

    @Test("A responder process that dies while answering: the caller fails fast, not at its time-out")
    func responderDies() async throws {
        // The command marks that the request has arrived, then takes far longer than the time-out allows.
        let marker = directory("arrived")
        let responder = try await responder("touch '\(marker)'; sleep 60; cat")
        let wormhole = try makeWormhole()
        let start = Date()
        // A thread of its own: the test runner's shared threads can be busy with other tests' polling.
        let killed = DispatchSemaphore(value: 0)
        Thread {
            _ = eventually(timeout: 60) { FileManager.default.fileExists(atPath: marker) }
            responder.kill()
            killed.signal()
        }.start()
        do {
            _ = try await wormhole.request(
                Query(term: "a"),
                identifier: "lookup",
                as: Answer.self,
                timeout: .seconds(600)
            )
            Issue.record("expected an error")
        } catch {
            #expect(error.code == .remoteFailure, "\(error)")
            #expect(error.message.contains("ended"))
        }
        #expect(Date().timeIntervalSince(start) < 100, "failed when the process ended, not at the 600 s time-out")
        try await blocking { killed.wait() }
        // Wait until the killed responder is gone for good before looking for it again.
        _ = try await offThePool { responder.finish(timeout: 10) }
        // Its socket is stale now: the next request finds nobody, and removes it.
        do {
            _ = try await wormhole.request(Query(term: "a"), identifier: "lookup", as: Answer.self)
            Issue.record("expected an error")
        } catch {
            #expect(error.code == .notReachable)
        }
        #expect(try sockets().isEmpty)
    }

    @Test("A live message reaches every listening process; nothing is stored for later")
    func liveBroadcast() async throws {
        try await offThePool {
            let listeners = try (0..<3).map { _ in
                try RunningTool(["live-listen"] + location + ["news", "--count", "1", "--timeout", "120"])
            }
            for listener in listeners { #expect(listener.waitUntilListening()) }
            let sent = try WormholeTool.run(["live-send"] + location + ["news", #"{"headline":"hi"}"#])
            #expect(sent.lines == ["reached 3"])
            for listener in listeners {
                let result = listener.finish()
                #expect(result.status == 0)
                #expect(result.lines == [#"{"headline":"hi"}"#])
            }
            let nobody = try WormholeTool.run(["live-send"] + location + ["news", #"{"headline":"late"}"#])
            #expect(nobody.status == 1)
            #expect(nobody.error.contains("not reachable"))
        }
    }

    @Test("Live messages in one process, and oversize ones refused")
    func inProcessLive() async throws {
        try await offThePool {
            let wormhole = try makeWormhole()
            let received = Collector<String>()
            let listener = try wormhole.listenForLiveMessages(withIdentifier: "news", as: Query.self) {
                received.append($0.term)
            }
            #expect(try wormhole.sendMessage(Query(term: "one"), identifier: "news") == 1)
            #expect(eventually { received.values == ["one"] })
            #expect(throws: WormholeError.self) {
                try wormhole.sendMessageData(Data(count: 100_000), identifier: "news")
            }
            listener.cancel()
            // The largest message a sender may send travels whole in one datagram.
            let largest = Data(
                (0..<(Wormhole.maximumLiveMessageSize - 256 - wormhole.sender.utf8.count)).map {
                    UInt8(truncatingIfNeeded: $0 &* 7)
                }
            )
            let bytes = Collector<Data>()
            let raw = try wormhole.listenForLiveMessageData(withIdentifier: "news", on: .notifierThread) {
                bytes.append($0)
            }
            #expect(try wormhole.sendMessageData(largest, identifier: "news") == 1)
            #expect(eventually { bytes.values == [largest] })
            raw.cancel()
            #expect(throws: WormholeError.self) { try wormhole.sendMessage(Query(term: "two"), identifier: "news") }
        }
    }
}
