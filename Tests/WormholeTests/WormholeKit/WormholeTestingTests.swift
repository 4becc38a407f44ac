import Foundation
import Testing
import WormholeKit
import WormholeTesting

@Suite("Test doubles for users' tests")
struct WormholeTestingTests {
    @Test("InMemoryTransiting keeps the Transiting contract")
    func inMemoryContract() async throws {
        try await offThePool {
            let transiting = InMemoryTransiting()
            let first = try transiting.writeMessage(Data("1".utf8), sender: "a", identifier: "x")
            let second = try transiting.writeMessage(Data("2".utf8), sender: "a", identifier: "x")
            #expect(second.sequence > first.sequence)
            #expect(try transiting.readMessage(identifier: "x")?.payload == Data("2".utf8))
            #expect(try transiting.identifiers() == ["x"])
            try transiting.deleteMessage(identifier: "x")
            #expect(try transiting.readMessage(identifier: "x") == nil)
            let third = try transiting.writeMessage(Data("3".utf8), sender: "a", identifier: "x")
            #expect(third.sequence > second.sequence, "sequences grow across deletion")
            try transiting.deleteAllMessages()
            #expect(try transiting.identifiers().isEmpty)
            #expect(throws: WormholeError.self) { try transiting.writeMessage(Data(), sender: "a", identifier: "../x") }
        }
    }

    @Test("ManualNotifier delivers when told, on the caller's thread, once per posted name")
    func manualNotifier() async throws {
        try await offThePool {
            let notifier = ManualNotifier()
            let wormhole = Wormhole(transiting: InMemoryTransiting(), notifier: notifier)
            let received = Collector<Int>()
            let listener = try wormhole.listenForMessage(withIdentifier: "button", as: Tap.self, on: .notifierThread) {
                received.append($0.number)
            }
            try wormhole.passMessageObject(Tap(number: 1), identifier: "button")
            try wormhole.passMessageObject(Tap(number: 2), identifier: "button")
            #expect(received.values.isEmpty, "nothing before delivery")
            #expect(notifier.postedNames == ["mailbox.button", "mailbox.button"])
            #expect(notifier.deliverPendingNotifications() == 1)
            #expect(received.values == [2], "coalesced to the newest")
            listener.cancel()
            #expect(notifier.observationCount == 0)
            try wormhole.passMessageObject(Tap(number: 3), identifier: "button")
            #expect(notifier.deliverPendingNotifications() == 0)
        }
    }

    @Test("ManualNotifier can deliver at once")
    func immediateDelivery() async throws {
        try await offThePool {
            let wormhole = Wormhole(
                transiting: InMemoryTransiting(),
                notifier: ManualNotifier(deliversImmediately: true)
            )
            let received = Collector<Int>()
            let listener = try wormhole.listenForMessage(withIdentifier: "b", as: Int.self, on: .notifierThread) {
                received.append($0)
            }
            try wormhole.passMessageObject(5, identifier: "b")
            #expect(received.values == [5])
            _ = listener
        }
    }
}

@Suite("The demo", .limit(minutes: 3))
struct DemoTests {
    @Test("wormhole demo runs an app, a widget and a late reader, and exits 0")
    func demo() async throws {
        try await offThePool {
            let (status, text, root) = try WormholeTool.runWithOwnGroupRoot(["demo", "--taps", "3"])
            #expect(status == 0, "\(text)")
            #expect(text.contains("[widget] tap 3 arrived"))
            #expect(text.contains(#"[app]    the widget replied: "widget shows 3""#))
            #expect(text.contains(#"[reader] "button" holds tap 3"#))
            #expect(text.contains("Round trip"))
            #expect(
                FileManager.default.fileExists(
                    atPath: root.path + "/group.com.example.wormhole-demo/wormhole/button.msg"
                )
            )
        }
    }
}
