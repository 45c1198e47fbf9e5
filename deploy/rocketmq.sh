#!/usr/bin/env bash
# RocketMQ checks for docker-compose.yml, mounted into the apache/rocketmq
# containers. Bash alone (with /dev/tcp) and coreutils, which the image has
# (4.9.4 is built on CentOS 7): mqadmin would start a JVM with a 1 GiB heap
# for every check, and it exits 0 whatever went wrong. cmd/flashsale
# TestRocketMQScript runs this script against the project's broker double.
#
#   rocketmq.sh answers HOST:PORT
#       HOST:PORT answers a remoting request within 3 s: a name server (or a
#       broker) is serving.
#   rocketmq.sh broker HOST:PORT NAMESRV BROKER_NAME
#       the broker at HOST:PORT answers, and the name server at NAMESRV routes
#       the topic named BROKER_NAME, which every broker registers along with
#       its own topics: the broker is registered (a name server drops a broker
#       120 s after its last heartbeat, or at once when its connection closes).
#   rocketmq.sh update-topic MQADMIN_ARGS...
#       runs mqadmin updateTopic MQADMIN_ARGS (-t TOPIC among them) and fails
#       unless its output says every master took the topic.
set -u
export LC_ALL=C

# be32 writes $1 as 4 big-endian bytes.
be32() {
	printf "$(printf '\\%03o' $(($1 >> 24 & 255)) $(($1 >> 16 & 255)) $(($1 >> 8 & 255)) $(($1 & 255)))"
}

# route asks HOST:PORT ($1) for the route of topic $2 (GET_ROUTEINFO_BY_TOPIC,
# request code 105) and prints the JSON header of the answer. A frame is
# total length, header length (its top byte the serialization: 0, JSON),
# header, body; all lengths big-endian int32.
route() {
	local host=${1%:*} port=${1##*:} topic=$2
	if [[ ! $topic =~ ^[A-Za-z0-9_-]+$ ]]; then
		echo "rocketmq.sh: bad topic name '$topic'" >&2
		return 2
	fi
	local header='{"code":105,"language":"OTHER","version":401,"opaque":1,"flag":0,"extFields":{"topic":"'$topic'"}}'
	exec 3<>"/dev/tcp/$host/$port" || return 1
	{
		be32 $((${#header} + 4))
		be32 ${#header}
		printf '%s' "$header"
	} >&3 || return 1
	# Byte by byte (dd bs=1): a buffered reader would swallow the header
	# along with the lengths.
	local lengths
	lengths=$(timeout 3 dd bs=1 count=8 <&3 2>/dev/null | od -An -tu1)
	set -- $lengths
	if [ $# -ne 8 ]; then
		echo "rocketmq.sh: no answer from $host:$port" >&2
		return 1
	fi
	timeout 3 dd bs=1 count=$(($6 << 16 | $7 << 8 | $8)) <&3 2>/dev/null
	exec 3>&-
}

answers() {
	local header
	header=$(route "$1" rocketmq-health-check) || return 1
	[[ $header == *'"code":'* ]]
}

broker() {
	answers "$1" || return 1
	local header
	header=$(route "$2" "$3") || return 1
	if [[ $header == *'"code":0,'* || $header == *'"code":0}'* ]]; then
		return 0
	fi
	echo "rocketmq.sh: broker $3 is not registered with $2: $header" >&2
	return 1
}

update_topic() {
	local topic="" prev="" arg
	for arg in "$@"; do
		[ "$prev" = -t ] && topic=$arg
		prev=$arg
	done
	if [ -z "$topic" ]; then
		echo "rocketmq.sh: update-topic needs -t TOPIC" >&2
		return 2
	fi
	local out
	out=$(sh "$ROCKETMQ_HOME/bin/mqadmin" updateTopic "$@" 2>&1)
	printf '%s\n' "$out"
	# 4.9.4's UpdateTopicSubCommand prints "create topic to <broker> success."
	# per master it created the topic on, then the topic's config once all of
	# them have; an error prints a stack trace and still exits 0
	# (MQAdminStartup). No master at all prints the config alone.
	if grep -q 'create topic to [^ ]* success\.' <<<"$out" && grep -qF "TopicConfig [topicName=$topic," <<<"$out"; then
		return 0
	fi
	echo "rocketmq.sh: updateTopic $topic failed" >&2
	return 1
}

case "${1:-} $#" in
"answers 2") answers "$2" ;;
"broker 4") broker "$2" "$3" "$4" ;;
update-topic\ *)
	shift
	update_topic "$@"
	;;
*)
	echo "usage: rocketmq.sh answers HOST:PORT | broker HOST:PORT NAMESRV BROKER_NAME | update-topic MQADMIN_ARGS..." >&2
	exit 2
	;;
esac
