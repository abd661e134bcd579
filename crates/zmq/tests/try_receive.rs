//! `Channel::try_receive_parts` over inproc: what waits in the inbox comes without waiting, in
//! order, and an empty inbox says `None`, as over tcp and ipc. A reader that looks there before
//! it waits (the rpc dispatcher after a frame of its own loopback) would otherwise see its
//! peers' messages only when nothing else was ready.

use ferromq_core::{Channel, ChannelConfig, Message, Method, Parts, SocketType};

mod support;

async fn open(socket_type: SocketType, method: Method, address: &str) -> Channel {
    support::open(ChannelConfig::new("data", socket_type, method).with_address(address)).await
}

fn text(parts: &Parts) -> Vec<&[u8]> {
    parts.iter().map(Message::data).collect()
}

#[tokio::test]
async fn an_inproc_pull_takes_what_waits_without_waiting() {
    let address = format!("inproc://try-receive-pull-{}", std::process::id());
    let mut pull = open(SocketType::Pull, Method::Bind, &address).await;
    let mut push = open(SocketType::Push, Method::Connect, &address).await;
    assert!(pull.try_receive_parts().is_none(), "an empty inbox");
    for word in ["one", "two", "three"] {
        push.send(Message::from(word))
            .await
            .map_err(|failed| failed.error)
            .expect("send");
    }
    for word in ["one", "two", "three"] {
        let parts = pull.try_receive_parts().expect("a message that is there");
        assert_eq!(text(&parts), [word.as_bytes()]);
    }
    assert!(pull.try_receive_parts().is_none(), "all three were taken");
    push.close().await.expect("close push");
    pull.close().await.expect("close pull");
}

#[tokio::test]
async fn an_inproc_rep_answers_the_request_it_took_without_waiting() {
    let address = format!("inproc://try-receive-rep-{}", std::process::id());
    let mut rep = open(SocketType::Rep, Method::Bind, &address).await;
    let mut req = open(SocketType::Req, Method::Connect, &address).await;
    req.send(Message::from("ping"))
        .await
        .map_err(|failed| failed.error)
        .expect("request");
    let request = rep.try_receive_parts().expect("the request is there");
    assert_eq!(text(&request), [b"ping".as_slice()]);
    // Out of turn: a rep that holds a request answers before it takes another.
    assert!(rep.try_receive_parts().is_none());
    rep.send(Message::from("pong"))
        .await
        .map_err(|failed| failed.error)
        .expect("reply");
    let reply = req.receive().await.expect("the reply");
    assert_eq!(reply.data(), b"pong");
    req.close().await.expect("close req");
    rep.close().await.expect("close rep");
}
