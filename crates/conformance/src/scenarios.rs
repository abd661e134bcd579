//! The scenarios that run inside one process: both ends of every channel are sockets of the same
//! transport instance, driven through [`Channel`] as device code drives them.

use std::sync::Arc;
use std::time::Duration;

use ferromq_core::{Address, Channel, Error, Message, Method, Parts, SocketType};

use crate::Scenario;
use crate::failure::{During, Failure};
use crate::fixture::{Fixture, parse, watch};
use crate::payload::{index_of, message, verify};

pub(crate) static ALL: &[Scenario] = &[
    scenario!(push_pull_carries_every_size_from_0_b_to_64_mib_intact_and_in_order),
    scenario!(multipart_messages_keep_every_part_empty_ones_included),
    scenario!(ten_thousand_messages_arrive_in_order_through_a_small_queue),
    scenario!(several_pushes_into_one_pull_keep_each_senders_order),
    scenario!(pair_talks_both_ways),
    scenario!(req_rep_round_trips_and_each_side_must_alternate),
    scenario!(a_rep_answers_each_of_several_requesters_and_no_other),
    scenario!(pub_sub_gives_each_subscriber_its_topics),
    scenario!(a_receive_with_nothing_to_receive_times_out),
    scenario!(a_send_without_a_peer_is_held_back_and_hands_the_message_back),
    scenario!(a_cancelled_receive_loses_nothing),
    scenario!(messages_sent_before_the_binder_exists_arrive),
    scenario!(a_stalled_receiver_holds_the_sender_back_and_nothing_is_lost),
    scenario!(a_reserved_send_never_waits_and_a_cancelled_reservation_loses_nothing),
    scenario!(close_returns_after_everything_accepted_was_delivered),
    scenario!(a_receiver_closing_with_messages_it_did_not_take_reports_them),
    scenario!(binding_an_address_twice_is_refused),
    scenario!(a_closed_binder_leaves_its_address_free_for_the_next),
    scenario!(a_peer_of_an_incompatible_pattern_gets_nothing),
];

/// A timeout that is the property under test, not a watchdog.
const SHORT: Duration = Duration::from_millis(100);

async fn push_pull(fixture: &Fixture) -> Result<(Channel, Channel), Failure> {
    let (pull, address) = fixture.bound(SocketType::Pull).await?;
    let push = fixture.connected(SocketType::Push, &address).await?;
    Ok((push, pull))
}

async fn send_payloads(
    fixture: Arc<Fixture>,
    mut push: Channel,
    sizes: Vec<usize>,
) -> Result<Channel, Failure> {
    for (idx, size) in sizes.into_iter().enumerate() {
        let message = message(fixture.transport(), idx as u64, size).await?;
        let what = format!("sending message {idx} of {size} bytes");
        watch(&what, push.send(message)).await?.during(&what)?;
    }
    Ok(push)
}

async fn receive_payloads(pull: &mut Channel, sizes: &[usize]) -> Result<(), Failure> {
    for (idx, &size) in sizes.iter().enumerate() {
        let what = format!("receiving message {idx} of {size} bytes");
        let received = watch(&what, pull.receive()).await?.during(&what)?;
        verify(idx as u64, size, received.data())?;
    }
    Ok(())
}

async fn push_pull_carries_every_size_from_0_b_to_64_mib_intact_and_in_order(
    fixture: Arc<Fixture>,
) -> Result<(), Failure> {
    let (push, mut pull) = push_pull(&fixture).await?;
    let mut sizes = Vec::new();
    for size in [
        0,
        1,
        7,
        8,
        64,
        255,
        256,
        257,
        1 << 10,
        64 << 10,
        1 << 20,
        8 << 20,
    ] {
        sizes.extend([size; 3]);
    }
    sizes.push(64 << 20);
    let sender = tokio::spawn(send_payloads(Arc::clone(&fixture), push, sizes.clone()));
    receive_payloads(&mut pull, &sizes).await?;
    let mut push = joined(sender).await?;
    push.close().await.during("closing the push")?;
    Ok(())
}

async fn multipart_messages_keep_every_part_empty_ones_included(
    fixture: Arc<Fixture>,
) -> Result<(), Failure> {
    const N_MESSAGES: u64 = 200;
    const PART_SIZES: [usize; 5] = [8, 0, 300, 70 << 10, 0];
    let (mut push, mut pull) = push_pull(&fixture).await?;
    let transport_fixture = Arc::clone(&fixture);
    let sender = tokio::spawn(async move {
        for idx in 0..N_MESSAGES {
            let mut parts = Parts::with_capacity(PART_SIZES.len());
            for size in PART_SIZES {
                parts.push(message(transport_fixture.transport(), idx, size).await?);
            }
            let what = format!("sending multipart message {idx}");
            watch(&what, push.send_parts(parts)).await?.during(&what)?;
        }
        Ok::<_, Failure>(push)
    });
    for idx in 0..N_MESSAGES {
        let what = format!("receiving multipart message {idx}");
        let parts = watch(&what, pull.receive_parts()).await?.during(&what)?;
        if parts.len() != PART_SIZES.len() {
            return Err(Failure::expectation(format!(
                "multipart message {idx}: {} parts arrived, {} were sent",
                parts.len(),
                PART_SIZES.len()
            )));
        }
        for (part, size) in parts.iter().zip(PART_SIZES) {
            verify(idx, size, part.data())?;
        }
    }
    let mut push = joined(sender).await?;
    push.close().await.during("closing the push")?;
    Ok(())
}

async fn ten_thousand_messages_arrive_in_order_through_a_small_queue(
    fixture: Arc<Fixture>,
) -> Result<(), Failure> {
    const N_MESSAGES: usize = 10_000;
    let mut pull_config = Fixture::config(SocketType::Pull, Method::Bind);
    pull_config.rcv_buf_size = 4;
    let (mut pull, address) = fixture.bound_with(pull_config).await?;
    let mut push_config = Fixture::config(SocketType::Push, Method::Connect);
    push_config.snd_buf_size = 4;
    let push = fixture.connected_with(push_config, &address).await?;
    let sizes: Vec<usize> = (0..N_MESSAGES).map(|idx| 16 + idx % 600).collect();
    let sender = tokio::spawn(send_payloads(Arc::clone(&fixture), push, sizes.clone()));
    receive_payloads(&mut pull, &sizes).await?;
    let mut push = joined(sender).await?;
    push.close().await.during("closing the push")?;
    Ok(())
}

/// Fan-in: three senders stream into one pull at once (for shmem, each through a descriptor
/// ring of its own, taken in turn). Every message arrives whole, once, and each sender's in the
/// order it sent them, whatever the interleaving; sizes vary pseudo-randomly per message
/// (inline and block-sized payloads, small queues so that rings and windows fill and wrap). A
/// transport whose channels serve one peer at a time (ofi) runs it with one sender.
async fn several_pushes_into_one_pull_keep_each_senders_order(
    fixture: Arc<Fixture>,
) -> Result<(), Failure> {
    let n_senders: u64 = if fixture.one_peer_per_channel() { 1 } else { 3 };
    const N_EACH: u64 = 3_000;
    /// Message `seq` of sender `sender`: its index names both.
    fn index(sender: u64, seq: u64) -> u64 {
        sender * 1_000_000 + seq
    }
    fn size_of(idx: u64) -> usize {
        16 + (idx.wrapping_mul(7919) % 3_000) as usize
    }
    let mut pull_config = Fixture::config(SocketType::Pull, Method::Bind);
    pull_config.rcv_buf_size = 16;
    let (mut pull, address) = fixture.bound_with(pull_config).await?;
    let mut senders = Vec::new();
    for sender in 0..n_senders {
        let mut push_config = Fixture::config(SocketType::Push, Method::Connect);
        push_config.snd_buf_size = 8 << sender;
        let mut push = fixture.connected_with(push_config, &address).await?;
        let fixture = Arc::clone(&fixture);
        senders.push(tokio::spawn(async move {
            for seq in 0..N_EACH {
                let idx = index(sender, seq);
                let message = message(fixture.transport(), idx, size_of(idx)).await?;
                let what = format!("sender {sender} sending its message {seq}");
                watch(&what, push.send(message)).await?.during(&what)?;
            }
            Ok::<Channel, Failure>(push)
        }));
    }
    let mut next_seq = vec![0u64; n_senders as usize];
    for n_received in 0..n_senders * N_EACH {
        let what = format!("receiving message {n_received} of {}", n_senders * N_EACH);
        let received = watch(&what, pull.receive()).await?.during(&what)?;
        let idx = index_of(received.data());
        let sender = idx / 1_000_000;
        let Some(expected) = next_seq.get_mut(sender as usize) else {
            return Err(Failure::expectation(format!(
                "message {idx} names no sender of this test"
            )));
        };
        let expected_idx = index(sender, *expected);
        if idx != expected_idx {
            return Err(Failure::expectation(format!(
                "sender {sender}: message {expected_idx} expected next, {idx} arrived (lost, reordered or duplicated)"
            )));
        }
        verify(idx, size_of(idx), received.data())?;
        *expected += 1;
    }
    for sender in senders {
        let mut push = joined(sender).await?;
        push.close().await.during("closing a push")?;
    }
    Ok(())
}

async fn pair_talks_both_ways(fixture: Arc<Fixture>) -> Result<(), Failure> {
    let (mut bound, address) = fixture.bound(SocketType::Pair).await?;
    let mut connected = fixture.connected(SocketType::Pair, &address).await?;
    for idx in 0..100u64 {
        let what = format!("pair message {idx}, connector to binder");
        pass_one(&fixture, &mut connected, &mut bound, idx, &what).await?;
        let what = format!("pair message {idx}, binder to connector");
        pass_one(&fixture, &mut bound, &mut connected, idx, &what).await?;
    }
    connected.close().await.during("closing the connector")?;
    bound.close().await.during("closing the binder")?;
    Ok(())
}

async fn pass_one(
    fixture: &Fixture,
    from: &mut Channel,
    to: &mut Channel,
    idx: u64,
    what: &str,
) -> Result<(), Failure> {
    let sent = message(fixture.transport(), idx, 100).await?;
    watch(what, from.send(sent)).await?.during(what)?;
    let received = watch(what, to.receive()).await?.during(what)?;
    verify(idx, 100, received.data())
}

async fn req_rep_round_trips_and_each_side_must_alternate(
    fixture: Arc<Fixture>,
) -> Result<(), Failure> {
    let (mut rep, address) = fixture.bound(SocketType::Rep).await?;
    let mut req = fixture.connected(SocketType::Req, &address).await?;

    let early = rep.send_timeout(Message::from("early"), SHORT).await;
    expect_wrong_socket_type("a rep sending before it received a request", early.err())?;
    let early = req.receive_timeout(SHORT).await;
    expect_wrong_socket_type(
        "a req receiving before it sent a request",
        early
            .err()
            .map(|error| ferromq_core::SendError::new(error, ())),
    )?;

    for idx in 0..20u64 {
        let what = format!("round trip {idx}");
        let request = message(fixture.transport(), idx, 64).await?;
        watch(&what, req.send(request)).await?.during(&what)?;
        if idx == 0 {
            let second = req.send_timeout(Message::from("second"), SHORT).await;
            expect_wrong_socket_type("a req sending twice without a reply", second.err())?;
        }
        let request = watch(&what, rep.receive()).await?.during(&what)?;
        verify(idx, 64, request.data())?;
        let reply = message(fixture.transport(), idx + 1000, 4096).await?;
        watch(&what, rep.send(reply)).await?.during(&what)?;
        let reply = watch(&what, req.receive()).await?.during(&what)?;
        verify(idx + 1000, 4096, reply.data())?;
    }
    req.close().await.during("closing the req")?;
    rep.close().await.during("closing the rep")?;
    Ok(())
}

/// Three requesters (one where a channel serves one peer) talk to one rep at once: each
/// request's reply goes back to its own requester, whichever connection the rep took it from.
async fn a_rep_answers_each_of_several_requesters_and_no_other(
    fixture: Arc<Fixture>,
) -> Result<(), Failure> {
    let n_requesters: u64 = if fixture.one_peer_per_channel() { 1 } else { 3 };
    const N_EACH: u64 = 200;
    /// Request `seq` of requester `requester`; its reply is the index plus `REPLY`.
    fn index(requester: u64, seq: u64) -> u64 {
        requester * 1_000_000 + seq
    }
    const REPLY: u64 = 500_000;
    let (mut rep, address) = fixture.bound(SocketType::Rep).await?;
    let mut requesters = Vec::new();
    for requester in 0..n_requesters {
        let mut req = fixture.connected(SocketType::Req, &address).await?;
        let fixture = Arc::clone(&fixture);
        requesters.push(tokio::spawn(async move {
            for seq in 0..N_EACH {
                let idx = index(requester, seq);
                let what = format!("requester {requester}'s round trip {seq}");
                let request = message(fixture.transport(), idx, 64).await?;
                watch(&what, req.send(request)).await?.during(&what)?;
                let reply = watch(&what, req.receive()).await?.during(&what)?;
                if index_of(reply.data()) != idx + REPLY {
                    return Err(Failure::expectation(format!(
                        "{what}: the reply to {} came, not to {idx}",
                        index_of(reply.data()).wrapping_sub(REPLY)
                    )));
                }
                verify(idx + REPLY, 512, reply.data())?;
            }
            Ok::<Channel, Failure>(req)
        }));
    }
    for n_answered in 0..n_requesters * N_EACH {
        let what = format!("answering request {n_answered}");
        let request = watch(&what, rep.receive()).await?.during(&what)?;
        let idx = index_of(request.data());
        verify(idx, 64, request.data())?;
        let reply = message(fixture.transport(), idx + REPLY, 512).await?;
        watch(&what, rep.send(reply)).await?.during(&what)?;
    }
    for requester in requesters {
        let mut req = joined(requester).await?;
        req.close().await.during("closing a req")?;
    }
    rep.close().await.during("closing the rep")?;
    Ok(())
}

fn expect_wrong_socket_type<T>(
    case: &str,
    outcome: Option<ferromq_core::SendError<T>>,
) -> Result<(), Failure> {
    match outcome {
        Some(failed) => match failed.error {
            Error::WrongSocketType { channel, .. } if channel.name == "data" => Ok(()),
            other => Err(Failure::expectation(format!(
                "{case}: expected an error saying the socket cannot do that now, got: {}",
                ferromq_core::error_chain(&other)
            ))),
        },
        None => Err(Failure::expectation(format!("{case} succeeded"))),
    }
}

async fn pub_sub_gives_each_subscriber_its_topics(fixture: Arc<Fixture>) -> Result<(), Failure> {
    if fixture.refuses(SocketType::Pub) {
        return refused_with_channel_named(&fixture, SocketType::Pub).await;
    }
    let (mut publisher, address) = fixture.bound(SocketType::Pub).await?;
    let mut all = fixture.connected(SocketType::Sub, &address).await?;
    all.subscribe(b"")
        .await
        .during("subscribing to everything")?;
    let mut only_a = fixture.connected(SocketType::Sub, &address).await?;
    only_a.subscribe(b"a").await.during("subscribing to a")?;

    // Subscriptions travel to the publisher asynchronously ("slow joiner"): publish a marker
    // both subscribers want until both have one.
    let mut joined = [false, false];
    let deadline = tokio::time::Instant::now() + crate::WATCHDOG;
    while joined != [true, true] {
        if tokio::time::Instant::now() > deadline {
            return Err(Failure::Stuck {
                what: "both subscribers to receive a marker".into(),
                after: crate::WATCHDOG,
            });
        }
        watch(
            "publishing a marker",
            publisher.send(Message::from("a-marker")),
        )
        .await?
        .during("publishing a marker")?;
        for (idx, subscriber) in [&mut all, &mut only_a].into_iter().enumerate() {
            if !joined[idx] {
                joined[idx] = subscriber
                    .receive_timeout(Duration::from_millis(10))
                    .await
                    .is_ok();
            }
        }
    }
    let topics = ["a1", "b1", "a2", "ab", "b2", "a-end"];
    for topic in topics {
        watch("publishing", publisher.send(Message::from(topic)))
            .await?
            .during("publishing")?;
    }
    for (subscriber, filter, name) in [(&mut all, "", "all"), (&mut only_a, "a", "only_a")] {
        let expected: Vec<&str> = topics
            .iter()
            .copied()
            .filter(|t| t.starts_with(filter))
            .collect();
        let mut got = Vec::new();
        while got.last() != Some(&"a-end".to_owned()) {
            let what = format!("subscriber {name} receiving");
            let received = watch(&what, subscriber.receive()).await?.during(&what)?;
            let text = String::from_utf8_lossy(received.data()).into_owned();
            if text != "a-marker" {
                got.push(text);
            }
        }
        if got != expected {
            return Err(Failure::expectation(format!(
                "subscriber {name} (filter {filter:?}) received {got:?}, expected {expected:?}"
            )));
        }
    }
    publisher.close().await.during("closing the publisher")?;
    Ok(())
}

/// A pattern the transport refuses by design must be refused when the channel is made or
/// attached, with an error that names the channel.
async fn refused_with_channel_named(
    fixture: &Fixture,
    socket_type: SocketType,
) -> Result<(), Failure> {
    let config = Fixture::config(socket_type, Method::Bind);
    let outcome = match ferromq_core::Channel::open(fixture.transport(), config, "data").await {
        Err(error) => Some(error),
        Ok(mut channel) => channel.bind(&parse(&fixture.fresh_address())?).await.err(),
    };
    match outcome {
        Some(error)
            if error
                .channel()
                .is_some_and(|channel| channel.name == "data") =>
        {
            Ok(())
        }
        Some(error) => Err(Failure::expectation(format!(
            "refusing a {} channel: the error does not name the channel: {}",
            socket_type.as_str(),
            ferromq_core::error_chain(&error)
        ))),
        None => Err(Failure::expectation(format!(
            "the suite says this transport refuses {} channels, but it bound one",
            socket_type.as_str()
        ))),
    }
}

async fn a_receive_with_nothing_to_receive_times_out(fixture: Arc<Fixture>) -> Result<(), Failure> {
    let (_push, mut pull) = push_pull(&fixture).await?;
    let outcome = watch("a receive with a timeout", pull.receive_timeout(SHORT)).await?;
    match outcome {
        Err(Error::Timeout { channel, after }) if channel.name == "data" && after == SHORT => {
            Ok(())
        }
        Err(other) => Err(Failure::expectation(format!(
            "a receive with nothing to receive: expected a timeout naming the channel, got: {}",
            ferromq_core::error_chain(&other)
        ))),
        Ok(message) => Err(Failure::expectation(format!(
            "a receive with nothing sent returned {} bytes",
            message.len()
        ))),
    }
}

async fn a_send_without_a_peer_is_held_back_and_hands_the_message_back(
    fixture: Arc<Fixture>,
) -> Result<(), Failure> {
    // A push connected to an address nobody binds.
    let address = parse(&fixture.unbound_address()?)?;
    let mut push = fixture
        .connected_with(held_back_config(SocketType::Push), &address)
        .await?;
    held_back_without_a_peer(&fixture, &mut push, "a push with no peer", true).await
}

/// Messages a sender with no peer may queue (`sndBufSize` of [`held_back_config`]).
const HELD_BACK_QUEUE: usize = 4;

fn held_back_config(socket_type: SocketType) -> ferromq_core::ChannelConfig {
    let mut config = Fixture::config(socket_type, Method::Connect);
    config.snd_buf_size = HELD_BACK_QUEUE;
    config.linger = 200;
    config
}

/// With no peer that can take them, a sender accepts at most `sndBufSize` messages (zeromq
/// none: its sends wait for a peer; shmem and ofi queue that many for a peer to come), then
/// holds the next one back and hands it back intact; closing reports every accepted message as
/// undelivered. Nothing is accepted and then forgotten.
async fn held_back_without_a_peer(
    fixture: &Fixture,
    channel: &mut Channel,
    name: &str,
    expect_timeout: bool,
) -> Result<(), Failure> {
    let capacity = channel.config().snd_buf_size as u64;
    let mut n_accepted = 0u64;
    loop {
        if n_accepted > capacity {
            return Err(Failure::expectation(format!(
                "{name} accepted {n_accepted} messages with nobody to take them, more than \
                 sndBufSize = {capacity}"
            )));
        }
        let sent = message(fixture.transport(), n_accepted, 64).await?;
        let what = format!("{name} sending message {n_accepted}");
        match watch(&what, channel.send_timeout(sent, SHORT)).await? {
            Ok(()) => n_accepted += 1,
            Err(failed) => {
                if expect_timeout && !matches!(failed.error, Error::Timeout { .. }) {
                    return Err(Failure::expectation(format!(
                        "{name}: expected a timeout, got: {}",
                        ferromq_core::error_chain(&failed.error)
                    )));
                }
                verify(n_accepted, 64, failed.message.data())?;
                break;
            }
        }
    }
    let what = format!("closing {name}");
    match watch(&what, channel.close()).await? {
        Ok(()) if n_accepted == 0 => Ok(()),
        Err(Error::Undelivered { n_messages, .. }) if n_messages == n_accepted => Ok(()),
        Ok(()) => Err(Failure::expectation(format!(
            "{name} accepted {n_accepted} messages nobody could take, and close reported no loss"
        ))),
        Err(other) => Err(Failure::expectation(format!(
            "closing {name} with {n_accepted} accepted messages nobody took: expected \
             'undelivered' naming {n_accepted}, got: {}",
            ferromq_core::error_chain(&other)
        ))),
    }
}

async fn a_cancelled_receive_loses_nothing(fixture: Arc<Fixture>) -> Result<(), Failure> {
    const N_MESSAGES: usize = 2000;
    let (push, mut pull) = push_pull(&fixture).await?;
    // Nothing is sent yet, so this receive is certainly mid-wait when it is dropped.
    if poll_receive_once(&mut pull).await.is_some() {
        return Err(Failure::expectation(
            "a receive completed before anything was sent",
        ));
    }
    let sizes = vec![200; N_MESSAGES];
    let sender = tokio::spawn(send_payloads(Arc::clone(&fixture), push, sizes.clone()));
    let mut next = 0u64;
    let deadline = tokio::time::Instant::now() + crate::WATCHDOG;
    let mut round = 0u32;
    while (next as usize) < N_MESSAGES {
        round = round.wrapping_add(1);
        if tokio::time::Instant::now() > deadline {
            return Err(Failure::Stuck {
                what: format!("message {next} of {N_MESSAGES}"),
                after: crate::WATCHDOG,
            });
        }
        // Receives are dropped after one poll, or raced by a timer that fires at once or after
        // a little while: many are dropped mid-wait, some after data arrived.
        let received = match round % 3 {
            0 => {
                let received = poll_receive_once(&mut pull).await;
                // Not a busy loop: the tasks that bring the data need this thread too.
                tokio::task::yield_now().await;
                received
            }
            limit => {
                tokio::select! {
                    received = pull.receive() => Some(received),
                    () = tokio::time::sleep(Duration::from_micros(50 * u64::from(limit - 1))) => None,
                }
            }
        };
        if let Some(received) = received {
            let received = received.during("a receive raced by a timer")?;
            verify(next, 200, received.data())?;
            next += 1;
        }
    }
    let mut push = joined(sender).await?;
    push.close().await.during("closing the push")?;
    Ok(())
}

/// Polls one receive exactly once and drops it if it is not complete.
async fn poll_receive_once(pull: &mut Channel) -> Option<ferromq_core::Result<Message>> {
    let mut receive = std::pin::pin!(pull.receive());
    std::future::poll_fn(|cx| match receive.as_mut().poll(cx) {
        std::task::Poll::Ready(received) => std::task::Poll::Ready(Some(received)),
        std::task::Poll::Pending => std::task::Poll::Ready(None),
    })
    .await
}

async fn messages_sent_before_the_binder_exists_arrive(
    fixture: Arc<Fixture>,
) -> Result<(), Failure> {
    const N_MESSAGES: usize = 20;
    let address_text = fixture.unbound_address()?;
    let address = parse(&address_text)?;
    let push = fixture.connected(SocketType::Push, &address).await?;
    let sizes = vec![3000; N_MESSAGES];
    let sender = tokio::spawn(send_payloads(Arc::clone(&fixture), push, sizes.clone()));
    // Give the sender a head start: it must wait for a peer, not fail.
    tokio::task::yield_now().await;
    let mut pull = fixture
        .open(Fixture::config(SocketType::Pull, Method::Bind))
        .await?;
    watch("binding the late pull", pull.bind(&address))
        .await?
        .during("binding the late pull")?;
    receive_payloads(&mut pull, &sizes).await?;
    let mut push = joined(sender).await?;
    push.close().await.during("closing the push")?;
    Ok(())
}

/// A push and its pull with queues of 16 messages each way (`sndBufSize`, `rcvBufSize`), so
/// that a receiver that stops taking holds the sender back soon.
async fn small_queues(fixture: &Fixture) -> Result<(Channel, Channel), Failure> {
    let mut pull_config = Fixture::config(SocketType::Pull, Method::Bind);
    pull_config.rcv_buf_size = 16;
    let (pull, address) = fixture.bound_with(pull_config).await?;
    let mut push_config = Fixture::config(SocketType::Push, Method::Connect);
    push_config.snd_buf_size = 16;
    let push = fixture.connected_with(push_config, &address).await?;
    Ok((push, pull))
}

async fn a_stalled_receiver_holds_the_sender_back_and_nothing_is_lost(
    fixture: Arc<Fixture>,
) -> Result<(), Failure> {
    // Far more than any queue and kernel buffer in between can hold, at this size.
    const LIMIT: u64 = 200_000;
    const SIZE: usize = 1024;
    let (mut push, mut pull) = small_queues(&fixture).await?;

    // The receiver does not receive. Sends are accepted until the sender is held back.
    let mut n_accepted = 0u64;
    let held_back = loop {
        if n_accepted == LIMIT {
            return Err(Failure::expectation(format!(
                "{LIMIT} messages of {SIZE} bytes accepted for a receiver that takes none: the \
                 sender is never held back"
            )));
        }
        let sent = message(fixture.transport(), n_accepted, SIZE).await?;
        // Generous: a send that waits this long with the peer stalled is held back, and one
        // that is merely slow (a debug build, a busy machine) is not mistaken for it.
        match watch(
            "a send to a stalled receiver",
            push.send_timeout(sent, Duration::from_millis(500)),
        )
        .await?
        {
            Ok(()) => n_accepted += 1,
            Err(failed) if matches!(failed.error, Error::Timeout { .. }) => break failed.message,
            Err(failed) => {
                return Err(Failure::call(
                    &format!("sending message {n_accepted} to a stalled receiver"),
                    &failed.error,
                ));
            }
        }
    };
    verify(n_accepted, SIZE, held_back.data())?;

    // The receiver wakes up: everything accepted arrives, in order, then the message that was
    // handed back, sent again.
    let sizes = vec![SIZE; n_accepted as usize + 1];
    let resend = tokio::spawn(async move {
        watch("re-sending the held-back message", push.send(held_back))
            .await?
            .during("re-sending the held-back message")?;
        Ok::<_, Failure>(push)
    });
    receive_payloads(&mut pull, &sizes).await?;
    let mut push = joined(resend).await?;
    push.close().await.during("closing the push")?;
    Ok(())
}

/// The two-phase send ([`Channel::reserve`], then [`ferromq_core::SendPermit::send`]): with
/// the receiver stalled, reservations are granted until the queue is full, every send through
/// one is accepted at once, and then a reservation waits (it times out, and a reservation
/// dropped mid-wait is a cancellation). The message held meanwhile is still the caller's:
/// once the receiver takes, everything accepted arrives in order, then that message.
/// Transport memory and heap messages alternate (shmem copies the heap ones into a block).
async fn a_reserved_send_never_waits_and_a_cancelled_reservation_loses_nothing(
    fixture: Arc<Fixture>,
) -> Result<(), Failure> {
    const LIMIT: u64 = 200_000;
    const SIZE: usize = 1024;
    let (mut push, mut pull) = small_queues(&fixture).await?;
    let make = |idx: u64| {
        let fixture = Arc::clone(&fixture);
        async move {
            if idx.is_multiple_of(2) {
                message(fixture.transport(), idx, SIZE).await
            } else {
                let mut heap = Message::new(SIZE);
                crate::payload::fill(idx, heap.data_mut());
                Ok(heap)
            }
        }
    };

    let mut n_accepted = 0u64;
    loop {
        if n_accepted == LIMIT {
            return Err(Failure::expectation(format!(
                "{LIMIT} reservations granted for a receiver that takes nothing: a reservation \
                 never waits for room"
            )));
        }
        let next = make(n_accepted).await?;
        // Generous, as in the stalled-receiver scenario: a reservation this late is waiting.
        let reserved = watch(
            "a reservation for a stalled receiver",
            push.reserve_timeout(Duration::from_millis(500)),
        )
        .await?;
        match reserved {
            Ok(permit) => {
                permit.send(next).map_err(|failed| {
                    Failure::call(
                        &format!("sending message {n_accepted} through its reservation"),
                        &failed.error,
                    )
                })?;
                n_accepted += 1;
            }
            Err(Error::Timeout { .. }) => break,
            Err(error) => {
                return Err(Failure::call(
                    &format!("reserving room for message {n_accepted}"),
                    &error,
                ));
            }
        }
    }
    // A reservation dropped while it waits: nothing is sent, nothing lost.
    let held = make(n_accepted).await?;
    if tokio::time::timeout(SHORT, push.reserve()).await.is_ok() {
        return Err(Failure::expectation(
            "a reservation was granted while the stalled receiver's queue was full",
        ));
    }

    let sizes = vec![SIZE; n_accepted as usize + 1];
    let resend = tokio::spawn(async move {
        let permit = watch("a reservation once the receiver takes", push.reserve())
            .await?
            .during("reserving room for the held message")?;
        permit
            .send(held)
            .map_err(|failed| Failure::call("sending the held message", &failed.error))?;
        Ok::<_, Failure>(push)
    });
    receive_payloads(&mut pull, &sizes).await?;
    let mut push = joined(resend).await?;
    push.close().await.during("closing the push")?;
    Ok(())
}

async fn close_returns_after_everything_accepted_was_delivered(
    fixture: Arc<Fixture>,
) -> Result<(), Failure> {
    const N_MESSAGES: usize = 2000;
    let (push, mut pull) = push_pull(&fixture).await?;
    let sizes: Vec<usize> = (0..N_MESSAGES).map(|idx| 4096 + idx).collect();
    let sender_fixture = Arc::clone(&fixture);
    let sender_sizes = sizes.clone();
    let sender = tokio::spawn(async move {
        let mut push = send_payloads(sender_fixture, push, sender_sizes).await?;
        watch("closing the push", push.close())
            .await?
            .during("closing the push with messages queued")?;
        // The socket is gone now: what was accepted left with it or before.
        drop(push);
        Ok::<_, Failure>(())
    });
    receive_payloads(&mut pull, &sizes).await?;
    joined(sender).await?;
    let extra = pull.receive_timeout(SHORT).await;
    if let Ok(message) = extra {
        return Err(Failure::expectation(format!(
            "a message nobody sent arrived after the last one (index {})",
            index_of(message.data())
        )));
    }
    Ok(())
}

/// A sender whose close said everything was delivered (or handed over) leaves the receiver to
/// account for it: a pull or pair that closes without taking some reports them, with their
/// count, as `Undelivered`, so that its device fails instead of losing them without a word.
async fn a_receiver_closing_with_messages_it_did_not_take_reports_them(
    fixture: Arc<Fixture>,
) -> Result<(), Failure> {
    const N_SENT: usize = 20;
    const N_TAKEN: usize = 5;
    for socket_type in [SocketType::Pull, SocketType::Pair] {
        let (mut receiver, address) = fixture.bound(socket_type).await?;
        let sender_type = match socket_type {
            SocketType::Pull => SocketType::Push,
            _ => SocketType::Pair,
        };
        // A short linger: a shmem sender waits that long for the receiver to take them before it
        // hands them over.
        let mut config = Fixture::config(sender_type, Method::Connect);
        config.linger = 200;
        let sender = fixture.connected_with(config, &address).await?;
        let mut sender = send_payloads(Arc::clone(&fixture), sender, vec![64; N_SENT]).await?;
        receive_payloads(&mut receiver, &[64; N_TAKEN]).await?;
        watch("closing the sender", sender.close())
            .await?
            .during("closing the sender after it sent everything")?;
        match watch("closing the receiver", receiver.close()).await? {
            Err(Error::Undelivered { n_messages, .. })
                if n_messages == (N_SENT - N_TAKEN) as u64 => {}
            other => {
                return Err(Failure::expectation(format!(
                    "a {socket_type:?} that took {N_TAKEN} of {N_SENT} closed with {other:?}, \
                     not Undelivered with {}",
                    N_SENT - N_TAKEN
                )));
            }
        }
    }
    Ok(())
}

async fn binding_an_address_twice_is_refused(fixture: Arc<Fixture>) -> Result<(), Failure> {
    let (_first, address) = fixture.bound(SocketType::Pull).await?;
    let mut second = fixture
        .open(Fixture::config(SocketType::Pull, Method::Bind))
        .await?;
    match watch("binding a bound address", second.bind(&address)).await? {
        Err(Error::AddressInUse { channel }) if channel.name == "data" => Ok(()),
        Err(other) => Err(Failure::expectation(format!(
            "binding {address} twice: expected 'address in use', got: {}",
            ferromq_core::error_chain(&other)
        ))),
        Ok(bound) => Err(Failure::expectation(format!(
            "binding {address} twice succeeded (bound {bound})"
        ))),
    }
}

async fn a_closed_binder_leaves_its_address_free_for_the_next(
    fixture: Arc<Fixture>,
) -> Result<(), Failure> {
    let (mut first, address) = fixture.bound(SocketType::Pull).await?;
    watch("closing the first binder", first.close())
        .await?
        .during("closing the first binder")?;
    drop(first);
    // A unix socket's file is the binder's to remove: a stale one is what makes the next bind
    // of a FairMQ-style fixed path fail after a restart.
    if let Address::Ipc { path } = &address
        && path.exists()
    {
        return Err(Failure::expectation(format!(
            "closing the binder of {address} left its socket file behind"
        )));
    }
    let mut second = fixture
        .open(Fixture::config(SocketType::Pull, Method::Bind))
        .await?;
    let what = format!("binding {address} again after its binder closed");
    watch(&what, second.bind(&address)).await?.during(&what)?;
    let mut push = fixture.connected(SocketType::Push, &address).await?;
    let sent = message(fixture.transport(), 0, 500).await?;
    watch("sending to the second binder", push.send(sent))
        .await?
        .during("sending to the second binder")?;
    let received = watch("the second binder receiving", second.receive())
        .await?
        .during("the second binder receiving")?;
    verify(0, 500, received.data())?;
    push.close().await.during("closing the push")
}

async fn a_peer_of_an_incompatible_pattern_gets_nothing(
    fixture: Arc<Fixture>,
) -> Result<(), Failure> {
    let mut bound_config = held_back_config(SocketType::Push);
    bound_config.method = Method::Bind;
    let (mut bound_push, address) = fixture.bound_with(bound_config).await?;
    let mut connected_push = fixture
        .connected_with(held_back_config(SocketType::Push), &address)
        .await?;
    // Push talks to pull only: each end is a sender without a peer. The refusal may surface as
    // a timeout or as an error naming the refused peer.
    held_back_without_a_peer(&fixture, &mut bound_push, "a push bound to a push", false).await?;
    held_back_without_a_peer(
        &fixture,
        &mut connected_push,
        "a push connected to a push",
        false,
    )
    .await
}

/// The result of a spawned part of a scenario.
pub(crate) async fn joined<T>(
    handle: tokio::task::JoinHandle<Result<T, Failure>>,
) -> Result<T, Failure> {
    watch("a task of the scenario", handle)
        .await?
        .map_err(|error| Failure::expectation(format!("a task of the scenario failed: {error}")))?
}
