import Dispatch
import Foundation
import Testing
import WormholeKit

/// The session contract, for every engine: WatchConnectivity's promises between a "phone" and a "watch", each with
/// a wormhole (an engine) of its own, as two processes or two hosts have.
@Suite("Contract: sessions", .limit(minutes: 3))
struct SessionContract {
    /// A session of `name` with `counterpart` on a new wormhole of the fixture, standing for a process of its own.
    static func session(_ fixture: EngineFixture, _ name: String, _ counterpart: String) throws -> WormholeSession {
        try WormholeSession(
            wormhole: try fixture.wormhole(name),
            name: name,
            counterpart: counterpart,
            receivedFilesDirectory: fixture.scratch("\(name)-inbox")
        )
    }

    /// Sends through the callback form and waits for exactly one of its handlers; without a reply, through the
    /// async form, which returns once the counterpart's handlers have all returned.
    static func send(
        _ session: WormholeSession,
        _ message: [String: JSONValue],
        expectsReply: Bool = true
    ) -> Result<[String: JSONValue], WormholeError> {
        let outcome = Collector<Result<[String: JSONValue], WormholeError>>()
        let done = DispatchSemaphore(value: 0)
        if !expectsReply {
            Task {
                do throws(WormholeError) {
                    outcome.append(.success(try await session.sendMessage(message, expectsReply: false)))
                } catch {
                    outcome.append(.failure(error))
                }
                done.signal()
            }
        } else {
            let replyHandler: @Sendable ([String: JSONValue]) -> Void = { (reply: [String: JSONValue]) -> Void in
                outcome.append(.success(reply))
                done.signal()
            }
            let errorHandler: @Sendable (WormholeError) -> Void = { (error: WormholeError) -> Void in
                outcome.append(.failure(error))
                done.signal()
            }
            session.sendMessage(message, replyHandler: replyHandler, errorHandler: errorHandler, timeout: .seconds(10))
        }
        _ = done.wait(timeout: .now() + 20)
        return outcome.values.first ?? .failure(WormholeError(.timedOut, "no handler was called"))
    }

    static func code(_ result: Result<[String: JSONValue], WormholeError>) -> WormholeError.Code? {
        if case .failure(let error) = result { return error.code }
        return nil
    }

    @Test(
        "The context set while the counterpart is away reaches it at activation: the newest only, changed keys",
        arguments: EngineKind.underTest
    )
    func contextWhileAway(kind: EngineKind) async throws {
        try await offThePool {
            let fixture = try EngineFixture(kind)
            let phone = try Self.session(fixture, "phone", "watch")
            try phone.activate()
            for value in 1...5 {
                try phone.updateApplicationContext(["a": .integer(Int64(value)), "b": "kept"])
            }
            #expect(try phone.applicationContext == ["a": 5, "b": "kept"])

            let watch = try Self.session(fixture, "watch", "phone")
            #expect(try watch.receivedApplicationContext == [:], "nothing received before activating")
            let updates = Collector<SessionContextUpdate>()
            let onlyA = Collector<SessionContextUpdate>()
            let all = watch.onApplicationContext { updates.append($0) }
            let keyed = watch.onApplicationContext(keys: ["a"]) { onlyA.append($0) }
            try watch.activate()
            #expect(eventually { updates.count == 1 })
            #expect(updates.values.first?.context == ["a": 5, "b": "kept"], "the newest context only")
            #expect(updates.values.first?.changedKeys == ["a", "b"])
            #expect(updates.values.first?.sender == "phone")
            #expect(eventually { (try? watch.receivedApplicationContext) == ["a": 5, "b": "kept"] })

            try phone.updateApplicationContext(["a": 5, "b": "changed"])
            #expect(eventually { updates.count == 2 })
            #expect(updates.values.last?.changedKeys == ["b"], "only the key that changed")
            usleep(200_000)
            #expect(onlyA.count == 1, "a handler of key a is not called for a change of b")
            #expect(updates.count == 2, "each context once")

            // Away again; a restarted watch hears only what changed since the context it received.
            watch.deactivate()
            #expect(watch.activationState == .notActivated)
            try phone.updateApplicationContext(["a": 6, "b": "changed"])
            let restarted = try Self.session(fixture, "watch", "phone")
            let later = Collector<SessionContextUpdate>()
            let laterHandler = restarted.onApplicationContext { later.append($0) }
            try restarted.activate()
            #expect(eventually { later.count == 1 })
            #expect(later.values.first?.changedKeys == ["a"])
            withExtendedLifetime((all, keyed, laterHandler)) {}
        }
    }

    @Test(
        "A context waits for a handler; a context wormhole reads it back after a relaunch",
        arguments: EngineKind.underTest
    )
    func contextWaitsForHandler(kind: EngineKind) async throws {
        try await offThePool {
            let fixture = try EngineFixture(kind)
            let phone = try Self.session(fixture, "phone", "watch")
            try phone.activate()
            try phone.updateApplicationContext(["theme": "dark"])
            let watch = try Self.session(fixture, "watch", "phone")
            try watch.activate()
            usleep(300_000)
            #expect(try watch.receivedApplicationContext == [:], "nobody took it")
            let updates = Collector<SessionContextUpdate>()
            let handler = watch.onApplicationContext { updates.append($0) }
            #expect(eventually { updates.count == 1 }, "the first handler gets it at once")
            // Recorded as received once the handlers have returned.
            #expect(eventually { (try? watch.receivedApplicationContext) == ["theme": "dark"] })
            handler.cancel()
            watch.deactivate()

            // Relaunched: the context wormhole reads the context received before, and can clear it.
            let relaunched = try Self.session(fixture, "watch", "phone")
            let wormhole = Wormhole(session: relaunched, transitingType: .sessionContext)
            #expect(try wormhole.message(withIdentifier: "theme", as: String.self) == "dark")
            #expect(try wormhole.identifiers() == ["theme"])
            try wormhole.clearMessageContents(forIdentifier: "theme")
            #expect(try wormhole.message(withIdentifier: "theme", as: String.self) == nil)

            // A message wormhole on the relaunched watch leaves the session's own messages to their handler.
            let phoneMessages = Wormhole(session: relaunched, transitingType: .sessionMessage)
            let replier = relaunched.onMessage { $0.reply(["ok": true]) }
            try relaunched.activate()
            #expect(eventually { phone.isReachable })
            #expect(try Self.send(phone, ["plain": 1]).get() == ["ok": true])

            // Cleared, then sent again: the listener hears it (sequences only grow).
            let themes = Collector<String>()
            let listener = try wormhole.listenForMessage(withIdentifier: "theme", as: String.self) { themes.append($0) }
            let phoneContext = Wormhole(session: phone, transitingType: .sessionContext)
            try phoneContext.passMessageObject("light", identifier: "theme")
            #expect(eventually { themes.values == ["light"] })
            try wormhole.clearMessageContents(forIdentifier: "theme")
            try phoneContext.passMessageObject("dark", identifier: "theme")
            #expect(eventually { themes.values == ["light", "dark"] })
            withExtendedLifetime((phoneMessages, replier, listener)) {}
        }
    }

    @Test("Messages: a reply, or not reachable, counterpart unknown, not activated", arguments: EngineKind.underTest)
    func messages(kind: EngineKind) async throws {
        try await offThePool {
            let fixture = try EngineFixture(kind)
            let phone = try Self.session(fixture, "phone", "watch")
            #expect(Self.code(Self.send(phone, ["ping": 1])) == .notActivated)
            let reachability = Collector<Bool>()
            let watcher = phone.onReachabilityChange { reachability.append($0) }
            try phone.activate()
            #expect(phone.isReachable == false)
            #expect(Self.code(Self.send(phone, ["ping": 1])) == .counterpartUnknown, "the watch never activated")

            let watch = try Self.session(fixture, "watch", "phone")
            let received = Collector<[String: JSONValue]>()
            let replier = watch.onMessage { message in
                received.append(message.message)
                if message.expectsReply { message.reply(["pong": message.message["ping"] ?? nil]) }
            }
            try watch.activate()
            #expect(eventually { phone.isReachable }, "the phone hears the watch activate")
            #expect(try Self.send(phone, ["ping": 7]).get() == ["pong": 7])
            #expect(try Self.send(phone, ["note": "no reply"], expectsReply: false).get() == [:])
            #expect(eventually { received.count == 2 })

            watch.deactivate()
            #expect(eventually { !phone.isReachable }, "the phone hears the watch deactivate")
            #expect(Self.code(Self.send(phone, ["ping": 2])) == .notReachable)
            #expect(reachability.values.prefix(2) == [true, false])
            withExtendedLifetime((watcher, replier)) {}
        }
    }

    @Test("A counterpart with no message handler fails the message at once", arguments: EngineKind.underTest)
    func noHandler(kind: EngineKind) async throws {
        try await offThePool {
            let fixture = try EngineFixture(kind)
            let phone = try Self.session(fixture, "phone", "watch")
            let watch = try Self.session(fixture, "watch", "phone")
            try phone.activate()
            try watch.activate()
            let result = Self.send(phone, ["ping": 1])
            #expect(Self.code(result) == .remoteFailure)
            if case .failure(let error) = result { #expect(error.message.contains("no message handler")) }
        }
    }

    @Test(
        "User info: in order, once, across restarts of both sides; cancel and current info",
        arguments: EngineKind.underTest
    )
    func userInfo(kind: EngineKind) async throws {
        try await offThePool {
            let fixture = try EngineFixture(kind)
            var phone = try Self.session(fixture, "phone", "watch")
            try phone.activate()
            var sent: [SessionUserInfoTransfer] = []
            for number in 1...12 {
                sent.append(try phone.transferUserInfo(["n": .integer(Int64(number))]))
            }
            let firstCurrent = try phone.transferCurrentComplicationUserInfo(["current": 1])
            let secondCurrent = try phone.transferCurrentComplicationUserInfo(["current": 2])
            #expect(try phone.outstandingUserInfoTransfers.map(\.id) == sent.map(\.id) + [secondCurrent.id])
            #expect(try phone.cancelUserInfoTransfer(sent[4]), "a queued transfer can be cancelled")
            #expect(try !phone.cancelUserInfoTransfer(firstCurrent), "replaced by the second current one")

            // The phone restarts: a new session object under the same name still sees its outbox.
            phone.deactivate()
            phone = try Self.session(fixture, "phone", "watch")
            try phone.activate()
            #expect(try phone.outstandingUserInfoTransfers.count == 12)
            let finished = Collector<SessionUserInfoTransfer>()
            let finishedHandler = phone.onUserInfoTransferFinished { finished.append($0) }

            // The watch takes some, restarts, and takes the rest.
            var watch = try Self.session(fixture, "watch", "phone")
            let received = Collector<SessionUserInfoTransfer>()
            var handler = watch.onUserInfo { received.append($0) }
            try watch.activate()
            #expect(eventually { received.count >= 3 })
            watch.deactivate()
            handler.cancel()
            let firstPart = received.count
            watch = try Self.session(fixture, "watch", "phone")
            handler = watch.onUserInfo { received.append($0) }
            try watch.activate()
            #expect(eventually { received.count == 12 }, "received \(received.count) after \(firstPart) before")
            usleep(300_000)
            let numbers = received.values.map {
                $0.userInfo["n"]?.intValue ?? $0.userInfo["current"].map { 100 + ($0.intValue ?? 0) } ?? -1
            }
            #expect(numbers == [1, 2, 3, 4, 6, 7, 8, 9, 10, 11, 12, 102], "in order, once, the cancelled one left out")
            #expect(received.values.last?.isCurrentComplicationInfo == true)
            #expect(eventually { (try? phone.outstandingUserInfoTransfers.isEmpty) == true })
            #expect(eventually { finished.count == 12 }, "the phone is told of each delivery: \(finished.count)")
            #expect(try !phone.cancelUserInfoTransfer(sent[0]), "delivered: too late to cancel")
            withExtendedLifetime((finishedHandler, handler)) {}
        }
    }

    @Test(
        "A handler that deactivates its session: no deadlock, nothing lost or repeated",
        arguments: EngineKind.underTest
    )
    func deactivateFromHandler(kind: EngineKind) async throws {
        try await offThePool {
            let fixture = try EngineFixture(kind)
            let phone = try Self.session(fixture, "phone", "watch")
            try phone.activate()
            for number in 1...3 { try phone.transferUserInfo(["n": .integer(Int64(number))]) }
            let watch = try Self.session(fixture, "watch", "phone")
            let received = Collector<Int>()
            let handler = watch.onUserInfo { transfer in
                received.append(transfer.userInfo["n"]?.intValue ?? -1)
                if received.count == 1 { watch.deactivate() }
            }
            try watch.activate()
            #expect(eventually { watch.activationState == .notActivated })
            usleep(300_000)
            #expect(received.values == [1], "nothing is taken once the session is deactivated")
            try watch.activate()
            #expect(eventually { received.count == 3 })
            usleep(200_000)
            #expect(received.values == [1, 2, 3])
            withExtendedLifetime(handler) {}
        }
    }

    @Test("Deactivated at once and activated again: each user info once", arguments: EngineKind.underTest)
    func reactivateAtOnce(kind: EngineKind) async throws {
        try await offThePool {
            let fixture = try EngineFixture(kind)
            let phone = try Self.session(fixture, "phone", "watch")
            try phone.activate()
            for number in 1...20 { try phone.transferUserInfo(["n": .integer(Int64(number))]) }
            let watch = try Self.session(fixture, "watch", "phone")
            let received = Collector<Int>()
            // Two handlers registered from two threads at once: one consumer all the same.
            let group = DispatchGroup()
            let handlers = Locked<[SessionListener]>([])
            for _ in 0..<2 {
                DispatchQueue.global().async(group: group) {
                    let handler = watch.onUserInfo(on: .notifierThread) { transfer in
                        if let number = transfer.userInfo["n"]?.intValue { received.append(number) }
                    }
                    handlers.withLock { $0.append(handler) }
                }
            }
            group.wait()
            for _ in 0..<5 {
                try watch.activate()
                watch.deactivate()
            }
            try watch.activate()
            #expect(eventually { Set(received.values).count == 20 })
            usleep(200_000)
            let numbers = received.values
            // Two handlers: each transfer twice, once to each, in order; never a third time.
            #expect(numbers.count == 40, "\(numbers)")
            #expect(Dictionary(grouping: numbers, by: { $0 }).values.allSatisfy { $0.count == 2 })
            withExtendedLifetime(handlers) {}
        }
    }

    @Test("Deactivating while a handler waits for its queue does not wait for it", arguments: EngineKind.underTest)
    func deactivateWhileHandlerWaits(kind: EngineKind) async throws {
        try await offThePool {
            let fixture = try EngineFixture(kind)
            let phone = try Self.session(fixture, "phone", "watch")
            try phone.activate()
            let watch = try Self.session(fixture, "watch", "phone")
            // The handler's queue is busy (as the main queue of an app may be) while the transfer comes.
            let busy = DispatchQueue(label: "busy")
            let release = DispatchSemaphore(value: 0)
            busy.async { release.wait() }
            let received = Collector<Int>()
            let handler = watch.onUserInfo(on: .queue(busy)) { transfer in
                received.append(transfer.userInfo["n"]?.intValue ?? -1)
            }
            try watch.activate()
            try phone.transferUserInfo(["n": 1])
            usleep(300_000)
            let returned = DispatchSemaphore(value: 0)
            DispatchQueue.global().async {
                watch.deactivate()
                returned.signal()
            }
            #expect(returned.wait(timeout: .now() + 5) == .success, "deactivate() returned without the busy queue")
            release.signal()
            #expect(eventually { received.values == [1] }, "the delivery under way finishes")
            try watch.activate()
            usleep(300_000)
            #expect(received.values == [1], "and is not delivered again")
            withExtendedLifetime(handler) {}
        }
    }

    @Test("Files: progress, metadata, delivered once; cancel before delivery", arguments: EngineKind.underTest)
    func files(kind: EngineKind) async throws {
        try await offThePool {
            let fixture = try EngineFixture(kind)
            let phone = try Self.session(fixture, "phone", "watch")
            try phone.activate()
            let source = fixture.scratch("track.gpx")
            let original = try TransferContract.randomFile(source, count: 1 << 20)
            let progress = Collector<TransferProgress>()
            let transfer = try phone.transferFile(source, metadata: ["kind": "track"]) { progress.append($0) }
            #expect(progress.values.last?.fraction == 1.0)
            let dropped = try phone.transferFile(source, name: "dropped.gpx")
            #expect(try phone.outstandingFileTransfers.map(\.id).sorted() == [transfer.id, dropped.id].sorted())
            #expect(try phone.cancelFileTransfer(dropped))
            #expect(try phone.outstandingFileTransfers.map(\.id) == [transfer.id])
            let finished = Collector<FileTransfer>()
            let finishedHandler = phone.onFileTransferFinished { finished.append($0) }

            let watch = try Self.session(fixture, "watch", "phone")
            let received = Collector<ReceivedFile>()
            let errors = Collector<WormholeError>()
            let errorHandler = watch.onError { errors.append($0) }
            let handler = watch.onFile { received.append($0) }
            try watch.activate()
            #expect(eventually { received.count == 1 })
            let file = try #require(received.values.first)
            #expect(file.transfer.metadata == ["kind": "track"])
            #expect(file.transfer.name == "track.gpx")
            #expect(try Data(contentsOf: URL(fileURLWithPath: file.path)) == original)
            #expect(file.path.hasPrefix(watch.receivedFilesDirectory))
            #expect(eventually { finished.values.map(\.id) == [transfer.id] })
            #expect(eventually { (try? phone.outstandingFileTransfers.isEmpty) == true })
            usleep(300_000)
            #expect(received.count == 1, "the cancelled file never arrives")
            withExtendedLifetime((finishedHandler, handler, errorHandler)) {}
        }
    }

    @Test("MMWormhole's form: passMessageObject and listenForMessage ride the session", arguments: EngineKind.underTest)
    func transitingTypes(kind: EngineKind) async throws {
        try await offThePool {
            let fixture = try EngineFixture(kind)
            let phone = try Self.session(fixture, "phone", "watch")
            let watch = try Self.session(fixture, "watch", "phone")
            let phoneContext = Wormhole(session: phone, transitingType: .sessionContext)
            let phoneMessages = Wormhole(session: phone, transitingType: .sessionMessage)
            let phoneFiles = Wormhole(session: phone, transitingType: .sessionFile)
            #expect(throws: WormholeError.self, "not activated: an error, never a silent drop") {
                try phoneContext.passMessageObject(Tap(number: 0), identifier: "button")
            }
            try phone.activate()
            try phoneContext.passMessageObject(Tap(number: 1), identifier: "button")
            try phoneContext.passMessageObject(Tap(number: 2), identifier: "button")
            try phoneContext.passMessageObject("dark", identifier: "theme")
            let error = #expect(throws: WormholeError.self) {
                try phoneMessages.passMessageObject(Tap(number: 3), identifier: "live")
            }
            #expect(error?.code == .counterpartUnknown)
            try phoneFiles.passMessageObject(Tap(number: 4), identifier: "attachment")

            // The watch's listeners are set before activation, as MMWormhole asks; nothing sent meanwhile is missed.
            let watchContext = Wormhole(session: watch, transitingType: .sessionContext)
            let watchMessages = Wormhole(session: watch, transitingType: .sessionMessage)
            let watchFiles = Wormhole(session: watch, transitingType: .sessionFile)
            let buttons = Collector<Tap>()
            let themes = Collector<String>()
            let lives = Collector<Tap>()
            let attachments = Collector<Tap>()
            let listeners = [
                try watchContext.listenForMessage(withIdentifier: "button", as: Tap.self) { buttons.append($0) },
                try watchContext.listenForMessage(withIdentifier: "theme", as: String.self) { themes.append($0) },
                try watchMessages.listenForMessage(withIdentifier: "live", as: Tap.self) { lives.append($0) },
                try watchFiles.listenForMessage(withIdentifier: "attachment", as: Tap.self) { attachments.append($0) },
            ]
            try watch.activate()
            #expect(eventually { buttons.values == [Tap(number: 2)] && themes.values == ["dark"] })
            #expect(
                try watchContext.message(withIdentifier: "button", as: Tap.self) == Tap(number: 2),
                "read after the wake-up"
            )
            #expect(eventually { attachments.values == [Tap(number: 4)] })

            // Only the identifier that changed fires.
            try phoneContext.passMessageObject("light", identifier: "theme")
            #expect(eventually { themes.values == ["dark", "light"] })
            #expect(buttons.count == 1)

            #expect(eventually { phone.isReachable })
            try phoneMessages.passMessageObject(Tap(number: 5), identifier: "live")
            #expect(eventually { lives.values == [Tap(number: 5)] })
            watch.deactivate()
            #expect(eventually { !phone.isReachable })
            let away = #expect(throws: WormholeError.self) {
                try phoneMessages.passMessageObject(Tap(number: 6), identifier: "live")
            }
            #expect(away?.code == .notReachable)
            withExtendedLifetime(listeners) {}
        }
    }

    @Test("Names are checked; sending needs activation")
    func names() async throws {
        try await offThePool {
            let fixture = try EngineFixture(.directory)
            let wormhole = try fixture.wormhole("x")
            for (name, counterpart) in [("a.b", "c"), ("phone", "phone"), ("", "c"), ("a/b", "c"), ("a", "../x")] {
                let error = #expect(throws: WormholeError.self) {
                    try WormholeSession(wormhole: wormhole, name: name, counterpart: counterpart)
                }
                #expect(error?.code == .invalidIdentifier)
            }
            let session = try WormholeSession(wormhole: wormhole, name: "phone", counterpart: "watch")
            #expect(session.activationState == .notActivated)
            for attempt in [
                { () throws -> Void in try session.updateApplicationContext(["a": 1]) },
                { () throws -> Void in _ = try session.transferUserInfo(["a": 1]) },
                { () throws -> Void in _ = try session.transferFile("/etc/hostname") },
            ] {
                let error = #expect(throws: WormholeError.self) { try attempt() }
                #expect(error?.code == .notActivated)
            }
            let states = Collector<SessionActivationState>()
            let observer = session.onActivationStateChange(on: .notifierThread) { states.append($0) }
            try session.activate()
            try session.activate()
            session.deactivate()
            #expect(states.values == [.activated, .inactive, .notActivated])
            withExtendedLifetime(observer) {}
        }
    }
}
